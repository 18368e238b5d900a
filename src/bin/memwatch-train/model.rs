//! A small GPT: token and position embeddings, pre-norm transformer blocks with causal self-attention,
//! and a language-model head.

use tch::nn;
use tch::{Device, Kind, Tensor};

struct Block {
    ln1: nn::LayerNorm,
    qkv: nn::Linear,
    proj: nn::Linear,
    ln2: nn::LayerNorm,
    fc: nn::Linear,
    out: nn::Linear,
    heads: i64,
}

impl Block {
    fn new(p: nn::Path, embed: i64, heads: i64) -> Block {
        Block {
            ln1: nn::layer_norm(&p / "ln1", vec![embed], Default::default()),
            qkv: nn::linear(&p / "qkv", embed, 3 * embed, Default::default()),
            proj: nn::linear(&p / "proj", embed, embed, Default::default()),
            ln2: nn::layer_norm(&p / "ln2", vec![embed], Default::default()),
            fc: nn::linear(&p / "fc", embed, 4 * embed, Default::default()),
            out: nn::linear(&p / "out", 4 * embed, embed, Default::default()),
            heads,
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        let (b, t, c) = x.size3().unwrap_or((1, 1, 1));
        let hd = c / self.heads;
        let qkv = x.apply(&self.ln1).apply(&self.qkv);
        let parts = qkv.split(c, -1);
        let shape = |z: &Tensor| z.view([b, t, self.heads, hd]).transpose(1, 2);
        let (q, k, v) = (shape(&parts[0]), shape(&parts[1]), shape(&parts[2]));
        let mask = Tensor::ones([t, t], (Kind::Bool, x.device()))
            .tril(0)
            .logical_not();
        let att = (q.matmul(&k.transpose(-2, -1)) / (hd as f64).sqrt())
            .masked_fill(&mask, f64::NEG_INFINITY)
            .softmax(-1, Kind::Float);
        let y = att
            .matmul(&v)
            .transpose(1, 2)
            .contiguous()
            .view([b, t, c])
            .apply(&self.proj);
        let x = x + y;
        let m = x
            .apply(&self.ln2)
            .apply(&self.fc)
            .gelu("none")
            .apply(&self.out);
        x + m
    }
}

pub struct Gpt {
    tok: nn::Embedding,
    pos: nn::Embedding,
    blocks: Vec<Block>,
    ln: nn::LayerNorm,
    head: nn::Linear,
    max_seq: i64,
}

impl Gpt {
    pub fn new(p: &nn::Path, vocab: i64, embed: i64, heads: i64, layers: i64, max_seq: i64) -> Gpt {
        Gpt {
            tok: nn::embedding(p / "tok", vocab, embed, Default::default()),
            pos: nn::embedding(p / "pos", max_seq, embed, Default::default()),
            blocks: (0..layers)
                .map(|i| Block::new(p / format!("block{i}"), embed, heads))
                .collect(),
            ln: nn::layer_norm(p / "ln", vec![embed], Default::default()),
            head: nn::linear(p / "head", embed, vocab, Default::default()),
            max_seq,
        }
    }

    /// Mean cross-entropy of predicting `ys` from `xs` (both `[batch, seq]`).
    pub fn loss(&self, xs: &Tensor, ys: &Tensor, device: Device) -> Tensor {
        let (_, t) = xs.size2().unwrap_or((1, 1));
        let t = t.min(self.max_seq);
        let xs = xs.narrow(1, 0, t);
        let ys = ys.narrow(1, 0, t);
        let pos = Tensor::arange(t, (Kind::Int64, device));
        let mut h = xs.apply(&self.tok) + pos.apply(&self.pos);
        for b in &self.blocks {
            h = b.forward(&h);
        }
        let logits = h.apply(&self.ln).apply(&self.head);
        let v = logits.size().last().copied().unwrap_or(1);
        logits
            .view([-1, v])
            .cross_entropy_for_logits(&ys.reshape([-1]))
    }
}

//! A small GPT: token and position embeddings, pre-norm transformer blocks with causal self-attention,
//! and a language-model head.

use tch::nn;
use tch::{Device, Kind, TchError, Tensor};

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

    /// The block's output, with libtorch's errors (an allocation failure among them) returned, not
    /// raised: each intermediate tensor is dropped on the way out, so a failed attempt frees what it
    /// held.
    fn f_forward(&self, x: &Tensor) -> Result<Tensor, TchError> {
        let (b, t, c) = x.size3()?;
        let hd = c / self.heads;
        let qkv = layer_norm(x, &self.ln1)?.f_linear(&self.qkv.ws, self.qkv.bs.as_ref())?;
        let parts = qkv.f_split(c, -1)?;
        let shape = |z: &Tensor| z.f_view([b, t, self.heads, hd])?.f_transpose(1, 2);
        let (q, k, v) = match parts.as_slice() {
            [q, k, v] => (shape(q)?, shape(k)?, shape(v)?),
            _ => {
                return Err(TchError::Shape(format!(
                    "qkv split in {} parts",
                    parts.len()
                )));
            }
        };
        let mask = Tensor::f_ones([t, t], (Kind::Bool, x.device()))?
            .f_tril(0)?
            .f_logical_not()?;
        let att = q
            .f_matmul(&k.f_transpose(-2, -1)?)?
            .f_div(&scalar((hd as f64).sqrt() as f32)?)?
            .f_masked_fill_tensor(&mask, &scalar(f32::NEG_INFINITY)?)?
            .f_softmax(-1, Kind::Float)?;
        let y = att
            .f_matmul(&v)?
            .f_transpose(1, 2)?
            .f_contiguous()?
            .f_view([b, t, c])?
            .f_linear(&self.proj.ws, self.proj.bs.as_ref())?;
        let x = x.f_add(&y)?;
        let m = layer_norm(&x, &self.ln2)?
            .f_linear(&self.fc.ws, self.fc.bs.as_ref())?
            .f_gelu("none")?
            .f_linear(&self.out.ws, self.out.bs.as_ref())?;
        x.f_add(&m)
    }
}

/// A 0-dimensional tensor holding `v`. tch's operations that take a `Scalar` (`f_div_scalar`,
/// `f_masked_fill`, `f_arange`, …) panic rather than return an error when the operation fails (the
/// `Scalar`'s drop reads libtorch's pending error first), so the forward pass uses tensors instead.
pub fn scalar(v: f32) -> Result<Tensor, TchError> {
    Tensor::f_from_slice(&[v])?.f_view(())
}

/// `nn::LayerNorm`'s forward with its default settings (eps 1e-5, cuDNN allowed), fallible.
fn layer_norm(x: &Tensor, ln: &nn::LayerNorm) -> Result<Tensor, TchError> {
    x.f_layer_norm(
        ln.normalized_shape.as_slice(),
        ln.ws.as_ref(),
        ln.bs.as_ref(),
        1e-5,
        true,
    )
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

    /// Mean cross-entropy of predicting `ys` from `xs` (both `[batch, seq]`): the forward pass, with
    /// libtorch's errors (an allocation failure among them) returned rather than raised.
    pub fn f_loss(&self, xs: &Tensor, ys: &Tensor, device: Device) -> Result<Tensor, TchError> {
        let (_, t) = xs.size2()?;
        let t = t.min(self.max_seq);
        let xs = xs.f_narrow(1, 0, t)?;
        let ys = ys.f_narrow(1, 0, t)?;
        let pos = Tensor::f_from_slice(&(0..t).collect::<Vec<i64>>())?.f_to(device)?;
        let emb = |e: &nn::Embedding, i: &Tensor| Tensor::f_embedding(&e.ws, i, -1, false, false);
        let mut h = emb(&self.tok, &xs)?.f_add(&emb(&self.pos, &pos)?)?;
        for b in &self.blocks {
            h = b.f_forward(&h)?;
        }
        let logits = layer_norm(&h, &self.ln)?.f_linear(&self.head.ws, self.head.bs.as_ref())?;
        let v = logits.size().last().copied().unwrap_or(1);
        logits
            .f_view([-1, v])?
            .f_log_softmax(-1, Kind::Float)?
            .f_nll_loss::<Tensor>(&ys.f_reshape([-1])?, None, tch::Reduction::Mean, -100)
    }

    /// The mean loss over `xs`, `ys` computed `micro` samples at a time (call under `no_grad`).
    pub fn f_eval(
        &self,
        xs: &Tensor,
        ys: &Tensor,
        micro: i64,
        device: Device,
    ) -> Result<f64, TchError> {
        let (n, _) = xs.size2()?;
        let (mut sum, mut pos) = (0.0, 0);
        while pos < n {
            let c = micro.max(1).min(n - pos);
            let loss = self.f_loss(&xs.f_narrow(0, pos, c)?, &ys.f_narrow(0, pos, c)?, device)?;
            sum += loss.f_double_value(&[])? * c as f64;
            pos += c;
        }
        Ok(sum / n.max(1) as f64)
    }
}

//! A model's shape from a Hugging Face `config.json`: GPT-2, Llama and Mistral, BERT, and T5 styles.
//! The parameter count is summed from the architecture's tensors (embeddings, attention, MLP, norms,
//! an untied head), so that `memwatch check --model-config` needs no `--params`.

use serde_json::Value;

/// What `check` needs from a config.
#[derive(Debug, Clone, PartialEq)]
pub struct Shape {
    /// The architecture family recognised (gpt2, llama, bert, t5 …).
    pub architecture: &'static str,
    /// Parameters, counted from the shapes.
    pub params: f64,
    /// Layers.
    pub layers: u64,
    /// Hidden size.
    pub hidden: u64,
    /// Attention heads.
    pub heads: u64,
    /// The longest sequence the model takes (its position table), if it says.
    pub max_seq: Option<u64>,
    /// The largest single tensor: usually the embedding.
    pub largest_layer: f64,
}

/// Why a model's config.json does not give its shape: the file as named, and what is missing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// Not JSON (the parser's words carry the line and column).
    #[error("{what}: not JSON: {reason}")]
    NotJson {
        /// The file, as named.
        what: String,
        /// The parser's words.
        reason: String,
    },
    /// A key the architecture needs holds no whole number.
    #[error("{what}: no whole number at {key:?}")]
    Missing {
        /// The file, as named.
        what: String,
        /// The key.
        key: String,
    },
}

/// Reads a config.json's text; `what` names it in errors.
pub fn parse(text: &str, what: &str) -> Result<Shape, ShapeError> {
    let v: Value = serde_json::from_str(text).map_err(|e| ShapeError::NotJson {
        what: what.to_owned(),
        reason: e.to_string(),
    })?;
    let get = |key: &str| v.get(key).and_then(Value::as_u64);
    let need = |key: &str| {
        get(key).ok_or_else(|| ShapeError::Missing {
            what: what.to_owned(),
            key: key.to_owned(),
        })
    };
    let kind = v.get("model_type").and_then(Value::as_str).unwrap_or("");
    let f = |n: u64| n as f64;
    if kind == "gpt2" || (kind.is_empty() && get("n_embd").is_some()) {
        let (l, h, heads, vocab, pos) = (
            need("n_layer")?,
            need("n_embd")?,
            need("n_head")?,
            need("vocab_size")?,
            need("n_positions")?,
        );
        let ff = get("n_inner").unwrap_or(4 * h);
        let (h, ff_) = (f(h), f(ff));
        // Attention (qkv and projection, with biases), MLP (with biases), two layer norms.
        let layer = 4.0 * h * h + 4.0 * h + 2.0 * h * ff_ + ff_ + h + 4.0 * h;
        let params = f(vocab) * h + f(pos) * h + f(l) * layer + 2.0 * h;
        return Ok(Shape {
            architecture: "gpt2",
            params,
            layers: l,
            hidden: h as u64,
            heads,
            max_seq: Some(pos),
            largest_layer: (f(vocab) * h).max(h * ff_),
        });
    }
    if kind == "t5" || get("d_model").is_some() {
        let (l, d, heads, vocab) = (
            need("num_layers")?,
            need("d_model")?,
            need("num_heads")?,
            need("vocab_size")?,
        );
        let dec = get("num_decoder_layers").unwrap_or(l);
        let inner = f(heads * get("d_kv").unwrap_or(d / heads.max(1)));
        let d_ff = f(need("d_ff")?);
        let gated = v
            .get("feed_forward_proj")
            .and_then(Value::as_str)
            .is_some_and(|p| p.starts_with("gated"));
        let d = f(d);
        let ff = if gated { 3.0 } else { 2.0 } * d * d_ff;
        let attn = 4.0 * d * inner;
        let buckets = f(get("relative_attention_num_buckets").unwrap_or(32) * heads);
        let tied = v
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(true);
        let params = f(vocab) * d
            + f(l) * (attn + ff + 2.0 * d)
            + f(dec) * (2.0 * attn + ff + 3.0 * d)
            + 2.0 * d
            + 2.0 * buckets
            + if tied { 0.0 } else { f(vocab) * d };
        return Ok(Shape {
            architecture: "t5",
            params,
            layers: l + dec,
            hidden: d as u64,
            heads,
            max_seq: None,
            largest_layer: (f(vocab) * d).max(d * d_ff),
        });
    }
    let (l, h, heads, vocab) = (
        need("num_hidden_layers")?,
        need("hidden_size")?,
        need("num_attention_heads")?,
        need("vocab_size")?,
    );
    let ff = f(need("intermediate_size")?);
    let pos = get("max_position_embeddings");
    let hf = f(h);
    if kind == "bert" || get("type_vocab_size").is_some() {
        let pos = pos.ok_or_else(|| ShapeError::Missing {
            what: what.to_owned(),
            key: "max_position_embeddings".to_owned(),
        })?;
        let types = f(get("type_vocab_size").unwrap_or(2));
        // Embeddings with their norm; per layer attention, MLP and two norms (with biases); pooler.
        let layer = 4.0 * hf * hf + 4.0 * hf + 2.0 * hf * ff + ff + hf + 4.0 * hf;
        let params = (f(vocab) + f(pos) + types) * hf + 2.0 * hf + f(l) * layer + hf * hf + hf;
        return Ok(Shape {
            architecture: "bert",
            params,
            layers: l,
            hidden: h,
            heads,
            max_seq: Some(pos),
            largest_layer: (f(vocab) * hf).max(hf * ff),
        });
    }
    // Llama and Mistral: grouped-query attention, a gated MLP, RMS norms, no biases.
    let kv = f(get("num_key_value_heads").unwrap_or(heads));
    let head_dim = f(get("head_dim").unwrap_or(h / heads.max(1)));
    let attn = hf * f(heads) * head_dim * 2.0 + 2.0 * hf * kv * head_dim;
    let layer = attn + 3.0 * hf * ff + 2.0 * hf;
    let tied = v
        .get("tie_word_embeddings")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let params = f(vocab) * hf * if tied { 1.0 } else { 2.0 } + f(l) * layer + hf;
    Ok(Shape {
        architecture: if kind.is_empty() {
            "llama"
        } else {
            "llama-like"
        },
        params,
        layers: l,
        hidden: h,
        heads,
        max_seq: pos,
        largest_layer: (f(vocab) * hf).max(hf * ff),
    })
}

#[cfg(test)]
mod tests {
    use super::{ShapeError, parse};

    #[test]
    fn well_known_models_count_as_published() {
        // (config, parameters as counted by transformers).
        let cases = [
            (
                r#"{"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12, "vocab_size": 50257, "n_positions": 1024}"#,
                124_439_808.0,
            ),
            (
                r#"{"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
                    "vocab_size": 32000, "intermediate_size": 11008, "max_position_embeddings": 4096}"#,
                6_738_415_616.0,
            ),
            (
                r#"{"model_type": "bert", "num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12,
                    "vocab_size": 30522, "intermediate_size": 3072, "max_position_embeddings": 512, "type_vocab_size": 2}"#,
                109_482_240.0,
            ),
        ];
        for (text, want) in cases {
            let s = parse(text, "config.json").unwrap();
            assert!(
                (s.params - want).abs() / want < 0.001,
                "{}: {} against {want}",
                s.architecture,
                s.params
            );
        }
    }

    #[test]
    fn a_config_that_says_too_little_is_named() {
        let e = parse(
            r#"{"model_type": "llama", "hidden_size": 4096}"#,
            "m/config.json",
        )
        .unwrap_err();
        assert_eq!(
            e,
            ShapeError::Missing {
                what: "m/config.json".into(),
                key: "num_hidden_layers".into()
            }
        );
        assert!(
            e.to_string()
                .starts_with("m/config.json: no whole number at \"num_hidden_layers\""),
            "{e}"
        );
        assert!(
            parse("[", "x.json")
                .unwrap_err()
                .to_string()
                .starts_with("x.json: not JSON")
        );
    }
}

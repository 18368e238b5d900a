//! The corpus as character ids, and an epoch's batches of (input, target) windows.

use tch::{Device, Kind, Tensor};

pub struct Corpus {
    pub vocab: Vec<char>,
    ids: Vec<i64>,
}

impl Corpus {
    pub fn new(text: &str) -> anyhow::Result<Corpus> {
        let mut vocab: Vec<char> = text.chars().collect();
        vocab.sort_unstable();
        vocab.dedup();
        let ids: Vec<i64> = text
            .chars()
            .filter_map(|c| vocab.binary_search(&c).ok().map(|i| i as i64))
            .collect();
        if ids.len() < 64 {
            anyhow::bail!(
                "the corpus has {} characters; at least 64 are needed",
                ids.len()
            );
        }
        Ok(Corpus { vocab, ids })
    }

    /// `n` random windows of `seq` + 1 characters as (inputs, targets), each `[n, seq]`.
    pub fn batch(&self, n: i64, seq: i64, device: Device) -> (Tensor, Tensor) {
        let seq = seq.min(self.ids.len() as i64 - 2);
        let max_start = self.ids.len() as i64 - seq - 1;
        let starts = Tensor::randint(max_start, [n], (Kind::Int64, Device::Cpu));
        let data = Tensor::from_slice(&self.ids);
        let offsets = Tensor::arange(seq + 1, (Kind::Int64, Device::Cpu));
        let idx = starts.unsqueeze(1) + offsets.unsqueeze(0);
        let windows = data.index_select(0, &idx.view([-1])).view([n, seq + 1]);
        (
            windows.narrow(1, 0, seq).to_device(device),
            windows.narrow(1, 1, seq).to_device(device),
        )
    }
}

impl Corpus {
    /// `n` windows at fixed, evenly spaced offsets: the same every time, for comparing losses.
    pub fn eval_batch(&self, n: i64, seq: i64, device: Device) -> (Tensor, Tensor) {
        let seq = seq.min(self.ids.len() as i64 - 2);
        let span = self.ids.len() as i64 - seq - 1;
        let starts: Vec<i64> = (0..n).map(|i| i * span / n.max(1)).collect();
        let data = Tensor::from_slice(&self.ids);
        let offsets = Tensor::arange(seq + 1, (Kind::Int64, Device::Cpu));
        let idx = Tensor::from_slice(&starts).unsqueeze(1) + offsets.unsqueeze(0);
        let windows = data.index_select(0, &idx.view([-1])).view([n, seq + 1]);
        (
            windows.narrow(1, 0, seq).to_device(device),
            windows.narrow(1, 1, seq).to_device(device),
        )
    }
}

//! Profiles: where each training knob lives in a known config format.

use super::error::ProfileError;
use serde::{Deserialize, Serialize};

/// The knobs memwatch may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Knob {
    /// Micro-batch per device.
    MicroBatch,
    /// Gradient accumulation steps.
    Accumulation,
    /// DataLoader workers per rank.
    Workers,
    /// DataLoader pin_memory.
    PinMemory,
    /// Sequence length.
    SeqLen,
    /// Ranks in the run (advised, never rewritten).
    WorldSize,
    /// DeepSpeed ZeRO stage (advised, never rewritten).
    ZeroStage,
}

impl Knob {
    /// A knob by name (`batch` is `micro_batch`); `None` for an unknown one.
    pub fn parse(s: &str) -> Option<Knob> {
        Some(match s {
            "batch" | "micro_batch" => Knob::MicroBatch,
            "accumulation" => Knob::Accumulation,
            "workers" => Knob::Workers,
            "pin_memory" => Knob::PinMemory,
            "seq_len" => Knob::SeqLen,
            "world_size" => Knob::WorldSize,
            "zero_stage" => Knob::ZeroStage,
            _ => return None,
        })
    }
    /// The knob's name, as in the API and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Knob::MicroBatch => "micro_batch",
            Knob::Accumulation => "accumulation",
            Knob::Workers => "workers",
            Knob::PinMemory => "pin_memory",
            Knob::SeqLen => "seq_len",
            Knob::WorldSize => "world_size",
            Knob::ZeroStage => "zero_stage",
        }
    }

    /// Changing this needs a restart: advised, never rewritten.
    pub fn needs_restart(self) -> bool {
        matches!(self, Knob::ZeroStage | Knob::WorldSize)
    }
}

/// A knob-to-path map.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// The profile's name: deepspeed, hf, accelerate, generic, or one given by keys alone.
    pub name: String,
    /// Each knob's dotted path in the file.
    pub keys: Vec<(Knob, String)>,
}

impl Profile {
    /// The dotted path of `knob`, if the profile has one.
    pub fn path(&self, knob: Knob) -> Option<&str> {
        self.keys
            .iter()
            .find(|(k, _)| *k == knob)
            .map(|(_, p)| p.as_str())
    }

    /// A built-in profile, with `overrides` (`knob=dotted.path`) on top; `generic` is overrides only.
    pub fn build(name: &str, overrides: &[String]) -> Result<Profile, ProfileError> {
        let base: &[(Knob, &str)] = match name {
            "deepspeed" => &[
                (Knob::MicroBatch, "train_micro_batch_size_per_gpu"),
                (Knob::Accumulation, "gradient_accumulation_steps"),
                (Knob::ZeroStage, "zero_optimization.stage"),
            ],
            "hf" => &[
                (Knob::MicroBatch, "per_device_train_batch_size"),
                (Knob::Accumulation, "gradient_accumulation_steps"),
                (Knob::Workers, "dataloader_num_workers"),
                (Knob::PinMemory, "dataloader_pin_memory"),
            ],
            "accelerate" => &[
                (
                    Knob::Accumulation,
                    "deepspeed_config.gradient_accumulation_steps",
                ),
                (
                    Knob::MicroBatch,
                    "deepspeed_config.train_micro_batch_size_per_gpu",
                ),
                (Knob::ZeroStage, "deepspeed_config.zero_stage"),
                (Knob::WorldSize, "num_processes"),
            ],
            "generic" => &[],
            other => return Err(ProfileError::Unknown(other.into())),
        };
        let mut keys: Vec<(Knob, String)> =
            base.iter().map(|(k, p)| (*k, (*p).to_owned())).collect();
        for o in overrides {
            let (knob, path) = o
                .split_once('=')
                .ok_or_else(|| ProfileError::NoEquals(o.clone()))?;
            let knob = Knob::parse(knob).ok_or_else(|| ProfileError::UnknownKnob(o.clone()))?;
            if path.is_empty() {
                return Err(ProfileError::EmptyPath(o.clone()));
            }
            keys.retain(|(k, _)| *k != knob);
            keys.push((knob, path.to_owned()));
        }
        if keys.is_empty() {
            return Err(ProfileError::NoKnobs);
        }
        Ok(Profile {
            name: name.to_owned(),
            keys,
        })
    }
}

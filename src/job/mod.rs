//! Attached jobs: how they are measured (`measure`), their cgroups' members read (`members`) and
//! who owns their cgroups (`owner`). `Job` and the records and views around it are memwatch-core's
//! (`memwatch_core::job`), re-exported here.

pub mod measure;
pub mod members;
pub mod owner;
pub mod runtime;

pub use measure::{JobSample, ProcessSample};
pub use memwatch_core::growth::Growth;
pub use memwatch_core::job::origin;
pub use memwatch_core::job::{
    EndedJob, GrowthAtPause, Held, Job, JobView, Launched, Limit, MIN_GROWTH, Measurement, Pause,
    PauseDeadline, PausePhase, Watch, tightest,
};
pub use memwatch_core::{held, way_out};

//! The collectors' names: each group of readers the sampler times, counts and reports together
//! (`memwatch::sample` runs them; an event's reason names one).

/// A collector: one group of readers, timed, counted and reported together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Collector {
    /// /proc/meminfo.
    Meminfo,
    /// /proc/vmstat.
    Vmstat,
    /// /proc/pressure.
    Pressure,
    /// The daemon's own cgroup.
    Cgroup,
    /// hwmon and thermal zones.
    Thermal,
    /// NVML.
    Gpu,
}

impl Collector {
    /// Every collector, in the order they run and are reported.
    pub const ALL: [Collector; 6] = [
        Collector::Meminfo,
        Collector::Vmstat,
        Collector::Pressure,
        Collector::Cgroup,
        Collector::Thermal,
        Collector::Gpu,
    ];

    /// The collector of that name (as `name` gives it).
    pub fn by_name(name: &str) -> Option<Collector> {
        Collector::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Its name in `memwatch_collector_*{collector}` and the API.
    pub const fn name(self) -> &'static str {
        match self {
            Collector::Meminfo => "meminfo",
            Collector::Vmstat => "vmstat",
            Collector::Pressure => "pressure",
            Collector::Cgroup => "cgroup",
            Collector::Thermal => "thermal",
            Collector::Gpu => "gpu",
        }
    }
}

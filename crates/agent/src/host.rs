//! What the node is besides its GPUs: its CPUs and memory, as the agent
//! tells the server when it registers (Slurm's `sinfo %c %m`, which
//! tools such as SkyPilot read as numbers).

/// The CPUs online on this machine, or None where the OS does not say.
pub fn cpus() -> Option<u32> {
    // SAFETY: sysconf reads a value; no memory is handed over.
    let online = unsafe { nix::libc::sysconf(nix::libc::_SC_NPROCESSORS_ONLN) };
    u32::try_from(online).ok().filter(|n| *n > 0)
}

/// This machine's memory in MiB (`MemTotal` of /proc/meminfo), or None
/// where it cannot be read.
pub fn memory_mib() -> Option<u64> {
    memory_mib_in(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

fn memory_mib_in(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024).filter(|m| *m > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_read_from_meminfos_total() {
        let meminfo = "MemTotal:       24608768 kB\nMemFree:         1000 kB\n";
        assert_eq!(memory_mib_in(meminfo), Some(24032));
        assert_eq!(memory_mib_in("MemFree: 5 kB\n"), None);
        assert_eq!(memory_mib_in("MemTotal: many kB\n"), None);
        assert!(cpus().is_some_and(|n| n >= 1));
        assert!(memory_mib().is_some_and(|m| m >= 1));
    }
}

//! GPU and node health: what an agent reads from NVML or the operator's
//! check, and what each finding makes the server do. The classification
//! lives here, beside the wire format, so that the agent, the server and
//! `scripts/gpu-check` say the same thing about the same reading.

use super::*;

/// The most findings one health report carries (a 64-GPU node with every
/// NVLink down is under it); more is refused.
pub const MAX_HEALTH_FINDINGS: usize = 512;

/// The longest output of a failed check a finding carries, in characters;
/// the agent keeps the end of it.
pub const MAX_CHECK_OUTPUT_CHARS: usize = 2048;

/// NVIDIA's threshold for replacing a GPU whose pages are retired: at 60
/// the GPU is out of service.
pub const RETIRED_PAGES_FATAL: u32 = 60;

/// A reading that is not as it should be, on one GPU (`gpu`) or on the
/// node as a whole (`gpu` absent: an operator's check that named no GPU).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, ToSchema)]
pub struct GpuFinding {
    /// The GPU's index on the node, as `CUDA_VISIBLE_DEVICES` counts them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(maximum = 63)]
    pub gpu: Option<u8>,
    #[serde(flatten)]
    pub finding: Finding,
}

/// As derived, but `kind` must be a string: serde takes a number there
/// as the variant's index, which the document rules out.
impl<'de> Deserialize<'de> for GpuFinding {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<GpuFinding, D::Error> {
        use serde::de::Error;
        #[derive(Deserialize)]
        struct Raw {
            #[serde(default)]
            gpu: Option<u8>,
            #[serde(flatten)]
            finding: Finding,
        }
        let value = serde_json::Value::deserialize(deserializer)?;
        if !value.get("kind").is_some_and(serde_json::Value::is_string) {
            return Err(D::Error::custom("kind: a string, one of the findings' kinds"));
        }
        let raw: Raw = serde_json::from_value(value).map_err(D::Error::custom)?;
        Ok(GpuFinding { gpu: raw.gpu, finding: raw.finding })
    }
}

/// What was found.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Finding {
    /// An Xid event the driver raised for the GPU.
    Xid { code: u32 },
    /// Volatile double-bit (uncorrectable) ECC errors since the driver
    /// loaded.
    EccDoubleBit { count: u64 },
    /// Pages retired for double-bit errors; `pending`: a retirement waits
    /// for the GPU's reset.
    RetiredPages { count: u32, pending: bool },
    /// Row remapping (A100 and later): `failed`: a row could not be
    /// remapped; `pending`: a remap waits for the GPU's reset.
    RemappedRows { failed: bool, pending: bool },
    /// The GPU is slowed by a thermal limit or the power brake.
    Throttled { reason: Throttle },
    /// The GPU's temperature at or above its slowdown threshold.
    Temperature { celsius: u32, slowdown_celsius: u32, shutdown_celsius: u32 },
    /// An NVLink of the GPU that is not active.
    NvlinkDown { link: u32 },
    /// The operator's check (`ebb agent --health-check`) exited non-zero
    /// (`code` absent: killed by a signal or timed out); the end of its
    /// output.
    CheckFailed {
        code: Option<i32>,
        #[schema(max_length = 2048)]
        output: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Throttle {
    Thermal,
    PowerBrake,
}

/// What a finding makes the server do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthClass {
    /// The GPU is out of service at once; the attempt on it is ended and
    /// requeued as a node loss is, billed to the fault.
    Fatal,
    /// The node drains: its preemptible work gets the drain window, other
    /// work runs to its end, then the node is out of service.
    Drain,
    /// Shown and counted; nothing changes.
    Warn,
}

impl HealthClass {
    pub fn name(self) -> &'static str {
        match self {
            HealthClass::Fatal => "fatal",
            HealthClass::Drain => "drain",
            HealthClass::Warn => "warn",
        }
    }
}

/// Xid codes that put a GPU out of service: double-bit ECC (48), the
/// GPU's micro-controller halted (61, 62), a page retirement or row remap
/// that failed (64), fallen off the bus (79), contained and uncontained
/// ECC errors (94, 95), GSP errors (119, 120), an unrecovered ECC error
/// (140). Xid 74 (an NVLink error) drains the node, as its peers' links
/// are involved. Every other Xid (13, 31, 43, 45 are most often the
/// application's own fault) is a warning.
pub const FATAL_XIDS: [u32; 10] = [48, 61, 62, 64, 79, 94, 95, 119, 120, 140];
pub const DRAIN_XIDS: [u32; 1] = [74];

impl GpuFinding {
    /// What the finding makes the server do. A finding that would take a
    /// GPU out but names none drains the node.
    pub fn class(&self) -> HealthClass {
        match self.gpu_class() {
            HealthClass::Fatal if self.gpu.is_none() => HealthClass::Drain,
            class => class,
        }
    }

    fn gpu_class(&self) -> HealthClass {
        match (&self.finding, self.gpu) {
            (Finding::Xid { code }, _) if FATAL_XIDS.contains(code) => HealthClass::Fatal,
            (Finding::Xid { code }, _) if DRAIN_XIDS.contains(code) => HealthClass::Drain,
            (Finding::Xid { .. }, _) => HealthClass::Warn,
            (Finding::EccDoubleBit { count }, _) if *count > 0 => HealthClass::Fatal,
            (Finding::EccDoubleBit { .. }, _) => HealthClass::Warn,
            (Finding::RetiredPages { count, .. }, _) if *count >= RETIRED_PAGES_FATAL => HealthClass::Fatal,
            (Finding::RetiredPages { pending: true, .. }, _) => HealthClass::Drain,
            (Finding::RetiredPages { .. }, _) => HealthClass::Warn,
            (Finding::RemappedRows { failed: true, .. }, _) => HealthClass::Fatal,
            (Finding::RemappedRows { pending: true, .. }, _) => HealthClass::Drain,
            (Finding::RemappedRows { .. }, _) => HealthClass::Warn,
            (Finding::Throttled { .. }, _) => HealthClass::Warn,
            (Finding::Temperature { celsius, shutdown_celsius, .. }, _)
                if *shutdown_celsius > 0 && celsius >= shutdown_celsius =>
            {
                HealthClass::Drain
            }
            (Finding::Temperature { .. }, _) => HealthClass::Warn,
            (Finding::NvlinkDown { .. }, _) => HealthClass::Drain,
            // A check that names a GPU takes that GPU out; one that names
            // none drains the node.
            (Finding::CheckFailed { .. }, Some(_)) => HealthClass::Fatal,
            (Finding::CheckFailed { .. }, None) => HealthClass::Drain,
        }
    }

    /// The finding's kind, as `/metrics` labels it.
    pub fn kind(&self) -> &'static str {
        match self.finding {
            Finding::Xid { .. } => "xid",
            Finding::EccDoubleBit { .. } => "ecc_double_bit",
            Finding::RetiredPages { .. } => "retired_pages",
            Finding::RemappedRows { .. } => "remapped_rows",
            Finding::Throttled { .. } => "throttled",
            Finding::Temperature { .. } => "temperature",
            Finding::NvlinkDown { .. } => "nvlink_down",
            Finding::CheckFailed { .. } => "check_failed",
        }
    }

    /// A sentence for people: "GPU 3: Xid 79 (fallen off the bus)".
    pub fn describe(&self) -> String {
        let what = match &self.finding {
            Finding::Xid { code } => match xid_meaning(*code) {
                Some(meaning) => format!("Xid {code} ({meaning})"),
                None => format!("Xid {code}"),
            },
            Finding::EccDoubleBit { count } => format!("{count} double-bit ECC errors"),
            Finding::RetiredPages { count, pending } => {
                let pending = if *pending { ", a retirement pending a reset" } else { "" };
                format!("{count} retired pages{pending}")
            }
            Finding::RemappedRows { failed, pending } => match (failed, pending) {
                (true, _) => "a row remap failed".to_string(),
                (false, true) => "a row remap pending a reset".to_string(),
                (false, false) => "rows remapped".to_string(),
            },
            Finding::Throttled { reason: Throttle::Thermal } => "throttled at its thermal limit".to_string(),
            Finding::Throttled { reason: Throttle::PowerBrake } => "throttled by the power brake".to_string(),
            Finding::Temperature { celsius, slowdown_celsius, shutdown_celsius } => format!(
                "{celsius} °C (slows down at {slowdown_celsius} °C, shuts down at {shutdown_celsius} °C)"
            ),
            Finding::NvlinkDown { link } => format!("NVLink {link} down"),
            Finding::CheckFailed { code, output } => {
                let how = match code {
                    Some(code) => format!("the health check exited {code}"),
                    None => "the health check was killed or timed out".to_string(),
                };
                match output.trim().lines().last() {
                    Some(line) => format!("{how}: {}", line.trim()),
                    None => how,
                }
            }
        };
        match self.gpu {
            Some(gpu) => format!("GPU {gpu}: {what}"),
            None => what,
        }
    }
}

/// What an Xid code means, for the codes the classification names.
pub fn xid_meaning(code: u32) -> Option<&'static str> {
    Some(match code {
        13 => "graphics engine exception",
        31 => "memory page fault",
        43 => "the GPU stopped processing",
        45 => "preemptive cleanup",
        48 => "double-bit ECC error",
        61 | 62 => "internal micro-controller halt",
        63 => "a page retirement or row remap recorded",
        64 => "a page retirement or row remap failed",
        74 => "NVLink error",
        79 => "fallen off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        119 | 120 => "GSP error",
        140 => "unrecovered ECC error",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on(gpu: u8, finding: Finding) -> GpuFinding {
        GpuFinding { gpu: Some(gpu), finding }
    }

    #[test]
    fn each_reading_has_its_class() {
        use HealthClass::*;
        let cases = [
            (on(3, Finding::Xid { code: 79 }), Fatal),
            (on(3, Finding::Xid { code: 48 }), Fatal),
            (on(3, Finding::Xid { code: 74 }), Drain),
            (on(3, Finding::Xid { code: 13 }), Warn),
            (on(0, Finding::EccDoubleBit { count: 1 }), Fatal),
            (on(0, Finding::EccDoubleBit { count: 0 }), Warn),
            (on(0, Finding::RetiredPages { count: 60, pending: false }), Fatal),
            (on(0, Finding::RetiredPages { count: 3, pending: true }), Drain),
            (on(0, Finding::RetiredPages { count: 3, pending: false }), Warn),
            (on(0, Finding::RemappedRows { failed: true, pending: false }), Fatal),
            (on(0, Finding::RemappedRows { failed: false, pending: true }), Drain),
            (on(5, Finding::Throttled { reason: Throttle::Thermal }), Warn),
            (on(5, Finding::Throttled { reason: Throttle::PowerBrake }), Warn),
            (on(5, Finding::Temperature { celsius: 88, slowdown_celsius: 87, shutdown_celsius: 92 }), Warn),
            (on(5, Finding::Temperature { celsius: 92, slowdown_celsius: 87, shutdown_celsius: 92 }), Drain),
            (on(1, Finding::NvlinkDown { link: 2 }), Drain),
            (on(2, Finding::CheckFailed { code: Some(1), output: String::new() }), Fatal),
            (
                GpuFinding {
                    gpu: None,
                    finding: Finding::CheckFailed { code: Some(1), output: String::new() },
                },
                Drain,
            ),
            (GpuFinding { gpu: None, finding: Finding::Xid { code: 79 } }, Drain),
        ];
        for (finding, class) in cases {
            assert_eq!(finding.class(), class, "{}", finding.describe());
        }
    }

    #[test]
    fn a_findings_kind_is_a_string_never_a_variants_number() {
        let err = serde_json::from_str::<GpuFinding>(r#"{"code":0,"kind":0,"output":""}"#).unwrap_err();
        assert!(err.to_string().starts_with("kind: a string"), "{err}");
        assert!(serde_json::from_str::<GpuFinding>(r#"{"gpu":1,"code":0}"#).is_err(), "no kind");
        let xid: GpuFinding = serde_json::from_str(r#"{"gpu":1,"kind":"xid","code":79}"#).unwrap();
        assert_eq!(xid, on(1, Finding::Xid { code: 79 }));
    }

    #[test]
    fn a_finding_reads_as_a_sentence_and_travels_flat() {
        let xid = on(3, Finding::Xid { code: 79 });
        assert_eq!(xid.describe(), "GPU 3: Xid 79 (fallen off the bus)");
        assert_eq!(serde_json::to_string(&xid).unwrap(), r#"{"gpu":3,"kind":"xid","code":79}"#);
        let check = GpuFinding {
            gpu: None,
            finding: Finding::CheckFailed { code: Some(2), output: "ok\nfan 3: stalled\n".into() },
        };
        assert_eq!(check.describe(), "the health check exited 2: fan 3: stalled");
        let back: GpuFinding = serde_json::from_str(&serde_json::to_string(&check).unwrap()).unwrap();
        assert_eq!(back, check);
    }
}

//! GPU discovery: NVML where a driver is present, simulated GPUs otherwise.

use nvml_wrapper::error::NvmlError;

/// What the node reports: how many GPUs and of which model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpus {
    pub count: u8,
    pub model: String,
    /// Each GPU's device minor (`/dev/nvidiaN`), by index.
    pub minors: Vec<u32>,
}

impl Gpus {
    /// `count` simulated GPUs of `model`, whose minors are their indices.
    pub fn simulated(count: u8, model: &str) -> Gpus {
        Gpus { count, model: model.to_string(), minors: (0..u32::from(count)).collect() }
    }
}

/// Why the node's GPUs could not be found or watched.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("no NVML driver found ({0}): on a machine without GPUs pass --fake-gpus N --gpu-model M")]
    NoDriver(NvmlError),
    /// An NVML call failed: what was asked, and NVML's answer.
    #[error("NVML {what}: {source}")]
    Nvml { what: String, source: NvmlError },
    #[error("NVML reports no GPUs")]
    NoGpus,
    #[error("a node must have one GPU model, NVML reports {}", .0.join(", "))]
    Models(Vec<String>),
    #[error("{0} GPUs on one node is more than ebb supports")]
    TooMany(u32),
}

/// An NVML call's error, saying what was asked.
fn asked(what: impl Into<String>, source: NvmlError) -> GpuError {
    GpuError::Nvml { what: what.into(), source }
}

/// Asks NVML for the node's GPUs. All GPUs of a node must be one model.
pub fn discover() -> Result<Gpus, GpuError> {
    let nvml = nvml_wrapper::Nvml::init().map_err(GpuError::NoDriver)?;
    let count = nvml.device_count().map_err(|e| asked("device count", e))?;
    if count == 0 {
        return Err(GpuError::NoGpus);
    }
    let mut models = Vec::new();
    let mut minors = Vec::new();
    for i in 0..count {
        let device = nvml.device_by_index(i).map_err(|e| asked(format!("device {i}"), e))?;
        models.push(device.name().map_err(|e| asked(format!("device {i} name"), e))?);
        minors.push(device.minor_number().map_err(|e| asked(format!("device {i} minor number"), e))?);
    }
    models.dedup();
    if models.len() != 1 {
        return Err(GpuError::Models(models));
    }
    let count = u8::try_from(count).map_err(|_| GpuError::TooMany(count))?;
    Ok(Gpus { count, model: models.remove(0).replace(' ', "-"), minors })
}

/// What NVML finds wrong with the node's GPUs now. Keeps which NVLinks
/// were active when it first looked, so that a link going down is seen
/// (a GPU without NVLink has none to lose).
pub struct NvmlReadings {
    nvml: nvml_wrapper::Nvml,
    count: u32,
    links_up: Vec<Vec<u32>>,
}

/// The most NVLinks a GPU has (NVML's `NVML_NVLINK_MAX_LINKS`).
const NVLINK_MAX_LINKS: u32 = 18;

impl NvmlReadings {
    pub fn open() -> Result<NvmlReadings, GpuError> {
        let nvml = nvml_wrapper::Nvml::init().map_err(GpuError::NoDriver)?;
        let count = nvml.device_count().map_err(|e| asked("device count", e))?;
        let mut links_up = Vec::new();
        for i in 0..count {
            let device = nvml.device_by_index(i).map_err(|e| asked(format!("device {i}"), e))?;
            let up = (0..NVLINK_MAX_LINKS)
                .filter(|&l| device.link_wrapper_for(l).is_active().unwrap_or(false))
                .collect();
            links_up.push(up);
        }
        Ok(NvmlReadings { nvml, count, links_up })
    }

    /// What NVML says of each GPU, a line each: what `ebb agent
    /// --check-gpus` shows beside the findings.
    pub fn describe(&self) -> Vec<String> {
        use nvml_wrapper::enum_wrappers::device::{TemperatureSensor, TemperatureThreshold};
        (0..self.count)
            .map(|i| match self.nvml.device_by_index(i) {
                Ok(d) => format!(
                    "GPU {i}: {} {}, {} °C (slowdown {} °C), {} NVLinks active, ECC mode {:?}, driver {}",
                    d.name().unwrap_or_default(),
                    d.uuid().unwrap_or_default(),
                    d.temperature(TemperatureSensor::Gpu).map_or("?".into(), |t| t.to_string()),
                    d.temperature_threshold(TemperatureThreshold::Slowdown)
                        .map_or("?".into(), |t| t.to_string()),
                    self.links_up[i as usize].len(),
                    d.is_ecc_enabled().map(|e| e.currently_enabled).ok(),
                    self.nvml.sys_driver_version().unwrap_or_default(),
                ),
                Err(e) => format!("GPU {i}: {e}"),
            })
            .collect()
    }

    /// Every finding on every GPU, read now. A reading a GPU does not
    /// support is skipped; a GPU NVML has lost is Xid 79.
    pub fn read(&self) -> Vec<ebb_api::GpuFinding> {
        use ebb_api::{Finding, GpuFinding, Throttle};
        use nvml_wrapper::bitmasks::device::ThrottleReasons;
        use nvml_wrapper::enum_wrappers::device::{
            EccCounter, MemoryError, RetirementCause, TemperatureSensor, TemperatureThreshold,
        };
        use nvml_wrapper::error::NvmlError;
        use nvml_wrapper::structs::device::FieldId;
        use nvml_wrapper::sys_exports::field_id::{
            NVML_FI_DEV_REMAPPED_FAILURE, NVML_FI_DEV_REMAPPED_PENDING,
        };

        let mut found = Vec::new();
        for i in 0..self.count {
            let gpu = Some(u8::try_from(i).unwrap_or(u8::MAX));
            let mut add = |finding| found.push(GpuFinding { gpu, finding });
            let device = match self.nvml.device_by_index(i) {
                Ok(device) => device,
                Err(NvmlError::GpuLost) => {
                    add(Finding::Xid { code: 79 });
                    continue;
                }
                Err(e) => {
                    tracing::warn!(gpu = i, "NVML cannot read the GPU: {e}");
                    continue;
                }
            };
            if let Err(NvmlError::GpuLost) = device.temperature(TemperatureSensor::Gpu) {
                add(Finding::Xid { code: 79 });
                continue;
            }
            if let Ok(count) = device.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
                if count > 0 {
                    add(Finding::EccDoubleBit { count });
                }
            }
            if let Ok(pages) = device.retired_pages(RetirementCause::DoubleBitEccError) {
                let pending = device.are_pages_pending_retired().unwrap_or(false);
                if !pages.is_empty() || pending {
                    let count = u32::try_from(pages.len()).unwrap_or(u32::MAX);
                    add(Finding::RetiredPages { count, pending });
                }
            }
            if let Ok(values) = device.field_values_for(&[
                FieldId(NVML_FI_DEV_REMAPPED_PENDING),
                FieldId(NVML_FI_DEV_REMAPPED_FAILURE),
            ]) {
                let set = |k: usize| {
                    values
                        .get(k)
                        .and_then(|v| v.as_ref().ok())
                        .and_then(|s| s.value.as_ref().ok())
                        .is_some_and(|v| {
                            use nvml_wrapper::enums::device::SampleValue::*;
                            match *v {
                                F64(x) => x != 0.0,
                                U32(x) => x != 0,
                                U64(x) => x != 0,
                                I64(x) => x != 0,
                            }
                        })
                };
                let (pending, failed) = (set(0), set(1));
                if pending || failed {
                    add(Finding::RemappedRows { failed, pending });
                }
            }
            if let Ok(reasons) = device.current_throttle_reasons() {
                let thermal = ThrottleReasons::HW_THERMAL_SLOWDOWN | ThrottleReasons::SW_THERMAL_SLOWDOWN;
                if reasons.intersects(thermal) {
                    add(Finding::Throttled { reason: Throttle::Thermal });
                }
                if reasons.contains(ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN) {
                    add(Finding::Throttled { reason: Throttle::PowerBrake });
                }
            }
            if let (Ok(celsius), Ok(slowdown_celsius)) = (
                device.temperature(TemperatureSensor::Gpu),
                device.temperature_threshold(TemperatureThreshold::Slowdown),
            ) {
                if celsius >= slowdown_celsius {
                    let shutdown_celsius =
                        device.temperature_threshold(TemperatureThreshold::Shutdown).unwrap_or(0);
                    add(Finding::Temperature { celsius, slowdown_celsius, shutdown_celsius });
                }
            }
            for &link in &self.links_up[i as usize] {
                if !device.link_wrapper_for(link).is_active().unwrap_or(false) {
                    add(Finding::NvlinkDown { link });
                }
            }
        }
        found
    }

    /// Waits for Xid events on every GPU, calling `seen` with each (GPU
    /// index, code) until `seen` returns false. Blocking: run it on a
    /// thread of its own.
    pub fn watch_xids(&self, mut seen: impl FnMut(u8, u32) -> bool) -> Result<(), GpuError> {
        use nvml_wrapper::bitmasks::event::EventTypes;
        use nvml_wrapper::enums::event::XidError;

        let mut set = self.nvml.create_event_set().map_err(|e| asked("event set", e))?;
        for i in 0..self.count {
            let device = self.nvml.device_by_index(i).map_err(|e| asked(format!("device {i}"), e))?;
            set = device
                .register_events(EventTypes::CRITICAL_XID_ERROR, set)
                .map_err(|e| asked(format!("Xid events of GPU {i}"), e.error))?;
        }
        loop {
            match set.wait(1000) {
                Ok(event) => {
                    let gpu = event.device.index().ok().and_then(|i| u8::try_from(i).ok()).unwrap_or(u8::MAX);
                    let code = match event.event_data {
                        Some(XidError::Value(code)) => u32::try_from(code).unwrap_or(u32::MAX),
                        _ => 0,
                    };
                    if !seen(gpu, code) {
                        return Ok(());
                    }
                }
                Err(NvmlError::Timeout) => {
                    if !seen(u8::MAX, 0) {
                        return Ok(());
                    }
                }
                Err(e) => return Err(asked("Xid events", e)),
            }
        }
    }
}

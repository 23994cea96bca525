//! GPU discovery: NVML where a driver is present, simulated GPUs otherwise.

/// What the node reports: how many GPUs and of which model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpus {
    pub count: u8,
    pub model: String,
}

/// Asks NVML for the node's GPUs. All GPUs of a node must be one model.
pub fn discover() -> Result<Gpus, String> {
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| {
        format!("no NVML driver found ({e}): on a machine without GPUs pass --fake-gpus N --gpu-model M")
    })?;
    let count = nvml.device_count().map_err(|e| format!("NVML device count: {e}"))?;
    if count == 0 {
        return Err("NVML reports no GPUs".into());
    }
    let mut models = Vec::new();
    for i in 0..count {
        let device = nvml.device_by_index(i).map_err(|e| format!("NVML device {i}: {e}"))?;
        models.push(device.name().map_err(|e| format!("NVML device {i} name: {e}"))?);
    }
    models.dedup();
    if models.len() != 1 {
        return Err(format!("a node must have one GPU model, NVML reports {}", models.join(", ")));
    }
    let count =
        u8::try_from(count).map_err(|_| format!("{count} GPUs on one node is more than ebb supports"))?;
    Ok(Gpus { count, model: models.remove(0).replace(' ', "-") })
}

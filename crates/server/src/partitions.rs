//! Slurm's partitions on Ebb: each a name for a tier, as the operator
//! maps them (`ebb server --partition-map spot=preemptible,gpu=on-demand
//! --default-partition spot`). Without a map, the partitions are the
//! tiers' own names, `preemptible` the default.

use ebb_core::Tier;

use crate::Refusal;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Partitions {
    /// Name and tier, in the order given.
    pub map: Vec<(String, Tier)>,
    /// The partition of jobs that name none.
    pub default: String,
}

impl Default for Partitions {
    fn default() -> Self {
        Partitions {
            map: [Tier::Preemptible, Tier::OnDemand, Tier::Reserved]
                .into_iter()
                .map(|t| (t.as_str().to_string(), t))
                .collect(),
            default: Tier::Preemptible.as_str().to_string(),
        }
    }
}

impl Partitions {
    /// `NAME=TIER,...` and the default's name (the first when none is
    /// given); every refusal names the flag.
    pub fn parse(map: Option<&str>, default: Option<&str>) -> Result<Partitions, String> {
        let mut partitions = match map {
            None => Partitions::default(),
            Some(text) => {
                let mut list = Vec::new();
                for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                    let (name, tier) = item.split_once('=').ok_or_else(|| {
                        format!("--partition-map {text}: expected NAME=TIER,... (TIER: preemptible, on-demand, reserved)")
                    })?;
                    let name = name.trim();
                    let valid = !name.is_empty()
                        && name.len() <= 64
                        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
                    if !valid {
                        return Err(format!(
                            "--partition-map: {name:?} is not a partition name (letters, digits, - _ .)"
                        ));
                    }
                    let tier: Tier =
                        tier.trim().parse().map_err(|e| format!("--partition-map {item}: {e}"))?;
                    if list.iter().any(|(n, _)| n == name) {
                        return Err(format!("--partition-map: partition {name} is given twice"));
                    }
                    list.push((name.to_string(), tier));
                }
                let first = list.first().map(|(n, _)| n.clone()).ok_or("--partition-map: no partitions")?;
                Partitions { map: list, default: first }
            }
        };
        if let Some(default) = default {
            if !partitions.map.iter().any(|(n, _)| n == default) {
                return Err(format!(
                    "--default-partition {default}: not a partition ({})",
                    partitions.names().join(", ")
                ));
            }
            partitions.default = default.to_string();
        }
        Ok(partitions)
    }

    fn names(&self) -> Vec<&str> {
        self.map.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The tier of jobs in `partition` (the default's when none).
    pub fn tier_of(&self, partition: Option<&str>) -> Result<Tier, Refusal> {
        let name = partition.unwrap_or(&self.default);
        self.map.iter().find(|(n, _)| n == name).map(|(_, t)| *t).ok_or_else(|| {
            Refusal::unacceptable(format!(
                "slurm.partition: no partition {name:?}; this cluster's are {}",
                self.names().join(", ")
            ))
        })
    }

    pub fn list(&self) -> Vec<ebb_api::Partition> {
        self.map
            .iter()
            .map(|(name, tier)| ebb_api::Partition {
                name: name.clone(),
                tier: tier.as_str().to_string(),
                default: *name == self.default,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_map_to_tiers_and_bad_maps_are_refused_by_name() {
        let p = Partitions::parse(Some("spot=preemptible, gpu=on-demand"), Some("gpu")).unwrap();
        assert_eq!(p.tier_of(Some("spot")).unwrap(), Tier::Preemptible);
        assert_eq!(p.tier_of(None).unwrap(), Tier::OnDemand);
        let err = p.tier_of(Some("debug")).unwrap_err();
        assert_eq!(err.message, "slurm.partition: no partition \"debug\"; this cluster's are spot, gpu");
        assert_eq!(Partitions::parse(None, None).unwrap().tier_of(None).unwrap(), Tier::Preemptible);
        assert!(Partitions::parse(Some("spot"), None).unwrap_err().contains("NAME=TIER"));
        assert!(Partitions::parse(Some("a=cheap"), None).unwrap_err().contains("a=cheap"));
        assert!(Partitions::parse(Some("a=reserved,a=on-demand"), None).unwrap_err().contains("twice"));
        assert!(Partitions::parse(Some("a b=reserved"), None).unwrap_err().contains("not a partition name"));
        assert!(Partitions::parse(None, Some("spot")).unwrap_err().contains("--default-partition spot"));
    }
}

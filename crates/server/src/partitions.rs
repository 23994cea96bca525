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

/// Why `--partition-map` or `--default-partition` cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PartitionsError {
    #[error("--partition-map {0}: expected NAME=TIER,... (TIER: preemptible, on-demand, reserved)")]
    Form(String),
    #[error("--partition-map: {0:?} is not a partition name (letters, digits, - _ .)")]
    Name(String),
    #[error("--partition-map {item}: {why}")]
    Tier { item: String, why: String },
    #[error("--partition-map: partition {0} is given twice")]
    Twice(String),
    #[error("--partition-map: no partitions")]
    Empty,
    #[error("--default-partition {given}: not a partition ({})", known.join(", "))]
    Default { given: String, known: Vec<String> },
}

impl Partitions {
    /// `NAME=TIER,...` and the default's name (the first when none is
    /// given); every refusal names the flag.
    pub fn parse(map: Option<&str>, default: Option<&str>) -> Result<Partitions, PartitionsError> {
        let mut partitions = match map {
            None => Partitions::default(),
            Some(text) => {
                let mut list = Vec::new();
                for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                    let (name, tier) =
                        item.split_once('=').ok_or_else(|| PartitionsError::Form(text.to_string()))?;
                    let name = name.trim();
                    let valid = !name.is_empty()
                        && name.len() <= 64
                        && name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
                    if !valid {
                        return Err(PartitionsError::Name(name.to_string()));
                    }
                    let tier: Tier = tier
                        .trim()
                        .parse()
                        .map_err(|e| PartitionsError::Tier { item: item.to_string(), why: format!("{e}") })?;
                    if list.iter().any(|(n, _)| n == name) {
                        return Err(PartitionsError::Twice(name.to_string()));
                    }
                    list.push((name.to_string(), tier));
                }
                let first = list.first().map(|(n, _)| n.clone()).ok_or(PartitionsError::Empty)?;
                Partitions { map: list, default: first }
            }
        };
        if let Some(default) = default {
            if !partitions.map.iter().any(|(n, _)| n == default) {
                let known = partitions.names().into_iter().map(str::to_string).collect();
                return Err(PartitionsError::Default { given: default.to_string(), known });
            }
            partitions.default = default.to_string();
        }
        Ok(partitions)
    }

    fn names(&self) -> Vec<&str> {
        self.map.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The tier of jobs in `partition` (the default's when none). A list
    /// (`a,b`: any of these, as Slurm takes it) is the tier its partitions
    /// share: a job has one tier, its price.
    pub fn tier_of(&self, partition: Option<&str>) -> Result<Tier, Refusal> {
        let listed = partition.unwrap_or(&self.default);
        let mut tiers: Vec<(&str, Tier)> = Vec::new();
        for name in listed.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let tier = self.map.iter().find(|(n, _)| n == name).map(|(_, t)| *t).ok_or_else(|| {
                Refusal::unacceptable(format!(
                    "slurm.partition: no partition {name:?}; this cluster's are {}",
                    self.names().join(", ")
                ))
            })?;
            tiers.push((name, tier));
        }
        match tiers.as_slice() {
            [] => Err(Refusal::unacceptable(format!("slurm.partition: {listed:?} names no partition"))),
            [(_, tier), rest @ ..] if rest.iter().all(|(_, t)| t == tier) => Ok(*tier),
            several => {
                let each: Vec<String> =
                    several.iter().map(|(n, t)| format!("{n} is {}", t.as_str())).collect();
                Err(Refusal::unacceptable(format!(
                    "slurm.partition: {listed}: {}, and a job has one tier, its price: name partitions of one tier",
                    each.join(", ")
                )))
            }
        }
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
        // A list is any of its partitions: the tier they share.
        let p = Partitions::parse(Some("spot=preemptible,idle=preemptible,gpu=on-demand"), None).unwrap();
        assert_eq!(p.tier_of(Some("spot,idle")).unwrap(), Tier::Preemptible);
        assert_eq!(
            p.tier_of(Some("spot,gpu")).unwrap_err().message,
            "slurm.partition: spot,gpu: spot is preemptible, gpu is on-demand, and a job has one tier, its price: \
             name partitions of one tier"
        );
        assert!(p.tier_of(Some("spot,debug")).unwrap_err().message.contains("no partition \"debug\""));
        assert!(p.tier_of(Some(",")).unwrap_err().message.contains("names no partition"));
        assert_eq!(Partitions::parse(None, None).unwrap().tier_of(None).unwrap(), Tier::Preemptible);
        let refused = |map, default| Partitions::parse(map, default).unwrap_err().to_string();
        assert!(refused(Some("spot"), None).contains("NAME=TIER"));
        assert!(refused(Some("a=cheap"), None).contains("a=cheap"));
        assert_eq!(
            Partitions::parse(Some("a=reserved,a=on-demand"), None).unwrap_err(),
            PartitionsError::Twice("a".into())
        );
        assert!(refused(Some("a b=reserved"), None).contains("not a partition name"));
        assert!(refused(None, Some("spot")).contains("--default-partition spot"));
    }
}

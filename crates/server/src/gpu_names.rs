//! The names a GPU model answers to. Nodes report their model as the
//! driver names it (`H100-80GB`); users and tools write what they know
//! (`h100`, `--gres=gpu:h100:2`, `H100_80GB` where a `-` cannot be
//! written). A requested name is the model that has it, else the one an
//! operator's alias names (`ebb server --gpu-alias h100=H100-80GB`), else
//! the one model it names ignoring case and punctuation, else the one
//! model whose name it begins (its family, `h100` for `H100-80GB`) when
//! no other's does. Several models for one name is an error that lists
//! them; the name is never guessed.

use std::collections::BTreeMap;

/// The operator's aliases: a name (any case) to the model it stands for.
#[derive(Clone, Debug, Default)]
pub struct GpuNames {
    aliases: BTreeMap<String, String>,
}

/// Why `--gpu-alias` cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("--gpu-alias {item:?}: {why}")]
pub struct GpuAliasError {
    item: String,
    why: &'static str,
}

/// The name as compared loosely: lower case, letters and digits only.
fn loose(name: &str) -> String {
    name.chars().filter(char::is_ascii_alphanumeric).map(|c| c.to_ascii_lowercase()).collect()
}

impl GpuNames {
    /// `NAME=MODEL,...` (`h100=H100-80GB,a100=A100-SXM4-80GB`).
    pub fn parse(map: &[String]) -> Result<GpuNames, GpuAliasError> {
        let mut aliases = BTreeMap::new();
        for item in map.iter().flat_map(|m| m.split(',')).filter(|i| !i.trim().is_empty()) {
            let bad = |why| GpuAliasError { item: item.to_string(), why };
            let (name, model) = item.split_once('=').ok_or_else(|| bad("expected NAME=MODEL"))?;
            let (name, model) = (name.trim(), model.trim());
            let plain = |s: &str| !s.is_empty() && s.len() <= 64 && s.chars().all(|c| c.is_ascii_graphic());
            if !plain(name) || !plain(model) {
                return Err(bad("NAME and MODEL are 1 to 64 printable characters"));
            }
            if aliases.insert(name.to_ascii_lowercase(), model.to_string()).is_some() {
                return Err(bad("the name is given twice"));
            }
        }
        Ok(GpuNames { aliases })
    }

    /// The model of `models` that `wanted` names; `None` where it names
    /// none; an error naming them where it names several.
    pub fn resolve<'m>(&self, wanted: &str, models: &[&'m str]) -> Result<Option<&'m str>, String> {
        let models = models.iter().copied();
        if let Some(model) = models.clone().find(|m| *m == wanted) {
            return Ok(Some(model));
        }
        if let Some(target) = self.aliases.get(&wanted.to_ascii_lowercase()) {
            return Ok(models.clone().find(|m| m == target));
        }
        let key = loose(wanted);
        if key.is_empty() {
            return Ok(None);
        }
        let one = |found: Vec<&'m str>| match found.as_slice() {
            [] => Ok(None),
            [model] => Ok(Some(*model)),
            several => Err(format!(
                "gpu_model: {wanted:?} names several models: {}; give one, or ask the operator for an alias \
                 (ebb server --gpu-alias)",
                several.join(", ")
            )),
        };
        if let Some(model) = one(models.clone().filter(|m| loose(m) == key).collect())? {
            return Ok(Some(model));
        }
        // A family: the model's name begins with it, at a boundary (`h100`
        // is `H100-80GB`'s, not `H1000`'s).
        one(models.filter(|m| family(m, &key)).collect())
    }
}

/// Whether `model`'s name begins with `key` (loose) and a part of the
/// name ends there: punctuation follows, or digits give way to letters
/// or letters to digits.
fn family(model: &str, key: &str) -> bool {
    let alnum: Vec<(usize, char)> = model.char_indices().filter(|(_, c)| c.is_ascii_alphanumeric()).collect();
    let n = key.len();
    if alnum.len() <= n || !alnum.iter().zip(key.chars()).all(|((_, c), k)| c.to_ascii_lowercase() == k) {
        return false;
    }
    let ((at, last), (next_at, next)) = (alnum[n - 1], alnum[n]);
    next_at != at + 1 || last.is_ascii_digit() != next.is_ascii_digit()
}
#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const FLEET: [&str; 4] = ["H100-80GB", "A100-SXM4-40GB", "A100-SXM4-80GB", "L4"];

    fn resolve(names: &GpuNames, wanted: &str) -> Result<Option<&'static str>, String> {
        names.resolve(wanted, &FLEET)
    }

    #[test]
    fn a_model_answers_to_its_case_its_punctuation_its_family_and_the_operators_aliases() {
        let none = GpuNames::default();
        for wanted in ["H100-80GB", "h100-80gb", "H100_80GB", "h10080gb", "h100", "H100"] {
            assert_eq!(resolve(&none, wanted), Ok(Some("H100-80GB")), "{wanted}");
        }
        assert_eq!(resolve(&none, "l4"), Ok(Some("L4")));
        assert_eq!(resolve(&none, "a100_sxm4_80gb"), Ok(Some("A100-SXM4-80GB")));
        assert_eq!(
            resolve(&none, "a100"),
            Err(
                "gpu_model: \"a100\" names several models: A100-SXM4-40GB, A100-SXM4-80GB; give one, or ask \
                 the operator for an alias (ebb server --gpu-alias)"
                    .into()
            )
        );
        assert_eq!(resolve(&none, "h1"), Ok(None), "a family ends at a boundary");
        assert_eq!(resolve(&none, "h200"), Ok(None));
        assert_eq!(resolve(&none, "-"), Ok(None));
        let aliases = GpuNames::parse(&["a100=A100-SXM4-80GB, small=L4".into()]).unwrap();
        assert_eq!(resolve(&aliases, "A100"), Ok(Some("A100-SXM4-80GB")));
        assert_eq!(resolve(&aliases, "small"), Ok(Some("L4")));
        assert!(GpuNames::parse(&["a100".into()]).unwrap_err().to_string().contains("expected NAME=MODEL"));
        assert!(GpuNames::parse(&["a=L4,A=L4".into()]).unwrap_err().to_string().contains("twice"));
    }

    proptest! {
        /// Any name resolves to a model of the fleet, to none, or to an
        /// error listing several; never a panic, never a model not there.
        #[test]
        fn any_name_resolves_to_a_model_there_or_to_none(wanted in "\\PC{0,24}") {
            match resolve(&GpuNames::default(), &wanted) {
                Ok(Some(model)) => prop_assert!(FLEET.contains(&model)),
                Ok(None) => {}
                Err(e) => prop_assert!(e.contains("names several models")),
            }
        }
    }
}

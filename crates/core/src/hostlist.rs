//! Slurm's host-list form (`node-[1-3,5],gpu7`): how `SLURM_JOB_NODELIST`
//! names a job's nodes, and what `scontrol show hostnames` expands.

/// The most names one list expands to: a list is a person's or a job's
/// input, and `n[0-99999999]` must not take the machine's memory.
pub const MAX_HOSTS: usize = 1 << 20;

/// `names` in host-list form, in their order: a run of names that differ
/// only in a trailing number of the same width (`node-1`, `node-2`) is one
/// `prefix[A-B]`; names without such a number stand alone.
pub fn compress(names: &[&str]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut group: Option<Group> = None;
    let flush = |group: &mut Option<Group>, out: &mut Vec<String>| {
        if let Some((prefix, width, ranges)) = group.take() {
            let number = |n: u64| format!("{n:0width$}");
            let single = ranges.len() == 1 && ranges[0].0 == ranges[0].1;
            if single {
                out.push(format!("{prefix}{}", number(ranges[0].0)));
            } else {
                let parts: Vec<String> = ranges
                    .iter()
                    .map(|&(a, b)| if a == b { number(a) } else { format!("{}-{}", number(a), number(b)) })
                    .collect();
                out.push(format!("{prefix}[{}]", parts.join(",")));
            }
        }
    };
    for name in names {
        let Some((prefix, digits)) = split_number(name) else {
            flush(&mut group, &mut out);
            out.push(name.to_string());
            continue;
        };
        let Ok(n) = digits.parse::<u64>() else {
            flush(&mut group, &mut out);
            out.push(name.to_string());
            continue;
        };
        let width = if digits.starts_with('0') && digits.len() > 1 { digits.len() } else { 0 };
        match &mut group {
            Some((p, w, ranges)) if *p == prefix && *w == width => match ranges.last_mut() {
                Some(last) if last.1.checked_add(1) == Some(n) => last.1 = n,
                _ => ranges.push((n, n)),
            },
            _ => {
                flush(&mut group, &mut out);
                group = Some((prefix, width, vec![(n, n)]));
            }
        }
    }
    flush(&mut group, &mut out);
    out.join(",")
}

/// Names being compressed into one `prefix[ranges]`: the prefix, the
/// numbers' width (0: unpadded) and their runs.
type Group<'a> = (&'a str, usize, Vec<(u64, u64)>);

/// A name's trailing digits and what precedes them, if it ends in digits.
fn split_number(name: &str) -> Option<(&str, &str)> {
    let at = name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    (at < name.len()).then(|| name.split_at(at))
}

/// The names a host list stands for, in order: `a[1-2]-b[3,5]` is `a1-b3,
/// a1-b5, a2-b3, a2-b5`; a range keeps its first number's width (`[01-10]`).
pub fn expand(list: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for item in split_top(list)? {
        if item.is_empty() {
            continue;
        }
        let mut names = vec![String::new()];
        let mut rest = item.as_str();
        while !rest.is_empty() {
            match rest.find('[') {
                None => {
                    names.iter_mut().for_each(|n| n.push_str(rest));
                    rest = "";
                }
                Some(open) => {
                    let close = rest[open..]
                        .find(']')
                        .map(|c| open + c)
                        .ok_or_else(|| format!("{item}: an unclosed ["))?;
                    let literal = &rest[..open];
                    let numbers = numbers(&rest[open + 1..close]).map_err(|e| format!("{item}: {e}"))?;
                    if names.len().saturating_mul(numbers.len()) > MAX_HOSTS {
                        return Err(format!("{item}: more than {MAX_HOSTS} names"));
                    }
                    names = names
                        .iter()
                        .flat_map(|n| numbers.iter().map(move |k| format!("{n}{literal}{k}")))
                        .collect();
                    rest = &rest[close + 1..];
                }
            }
        }
        if out.len() + names.len() > MAX_HOSTS {
            return Err(format!("more than {MAX_HOSTS} names"));
        }
        out.extend(names);
    }
    Ok(out)
}

/// The list's items: split at commas outside brackets.
fn split_top(list: &str) -> Result<Vec<String>, String> {
    let (mut items, mut current, mut depth) = (Vec::new(), String::new(), 0u32);
    for c in list.chars() {
        match c {
            '[' if depth > 0 => return Err(format!("{list}: brackets inside brackets")),
            '[' => depth += 1,
            ']' if depth == 0 => return Err(format!("{list}: a ] without its [")),
            ']' => depth -= 1,
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut current));
                continue;
            }
            c if c.is_whitespace() => return Err(format!("{list:?}: a space in a host list")),
            _ => {}
        }
        current.push(c);
    }
    if depth > 0 {
        return Err(format!("{list}: an unclosed ["));
    }
    items.push(current);
    Ok(items)
}

/// `1-3,5` or `01-03`: the numbers, as written (with their width).
fn numbers(ranges: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in ranges.split(',') {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let digits = |s: &str| !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(a) || !digits(b) {
            return Err(format!("[{ranges}]: expected numbers and ranges like 1-3,5"));
        }
        let (x, y): (u64, u64) = (a.parse().expect("digits"), b.parse().expect("digits"));
        if x > y {
            return Err(format!("[{ranges}]: {part} runs backwards"));
        }
        if (y - x) as usize >= MAX_HOSTS || out.len() + (y - x) as usize >= MAX_HOSTS {
            return Err(format!("[{ranges}]: more than {MAX_HOSTS} names"));
        }
        let width = a.len();
        out.extend((x..=y).map(|n| format!("{n:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_are_compressed_as_slurm_writes_them() {
        assert_eq!(compress(&["node-1", "node-2", "node-3", "node-5"]), "node-[1-3,5]");
        assert_eq!(compress(&["node-0"]), "node-0");
        assert_eq!(compress(&["gpu01", "gpu02", "login"]), "gpu[01-02],login");
        assert_eq!(compress(&["a1", "b1", "a2"]), "a1,b1,a2");
        assert_eq!(compress(&[]), "");
    }

    #[test]
    fn lists_expand_to_their_names_and_bad_ones_are_refused_by_what_is_wrong() {
        assert_eq!(expand("node-[1-3,5]").unwrap(), ["node-1", "node-2", "node-3", "node-5"]);
        assert_eq!(expand("gpu[08-10],login").unwrap(), ["gpu08", "gpu09", "gpu10", "login"]);
        assert_eq!(expand("r[1-2]n[3,5]").unwrap(), ["r1n3", "r1n5", "r2n3", "r2n5"]);
        assert_eq!(expand("solo").unwrap(), ["solo"]);
        assert!(expand("n[1-").unwrap_err().contains("unclosed"));
        assert!(expand("n[3-1]").unwrap_err().contains("backwards"));
        assert!(expand("n[0-99999999999]").unwrap_err().contains("more than"));
        assert!(expand("n[a]").unwrap_err().contains("expected numbers"));
        assert!(expand("n]").unwrap_err().contains("without"));
        assert!(expand("n[[1]]").unwrap_err().contains("inside"));
    }

    proptest! {
        /// Whatever names a job's nodes have, the list expands back to them.
        #[test]
        fn a_compressed_list_expands_to_the_names(names in proptest::collection::vec("[a-z]{1,3}-?[0-9]{0,3}", 0..20)) {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let list = compress(&refs);
            let back = if names.is_empty() { Vec::new() } else { expand(&list).unwrap() };
            prop_assert_eq!(back, names);
        }

        /// No input makes `expand` panic or grow without bound.
        #[test]
        fn any_text_expands_or_is_refused(text in "[a-z0-9\\[\\],\\- ]{0,40}") {
            if let Ok(names) = expand(&text) {
                prop_assert!(names.len() <= MAX_HOSTS);
            }
        }
    }
}

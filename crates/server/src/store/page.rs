//! Job pages in SQL: one query shape per set of filters, written once for
//! SQLite and PostgreSQL, which differ only in their placeholders.

use super::{JobPageQuery, FINISHED_STATES};

/// A value bound to a page query's placeholder.
#[derive(Clone, Debug)]
pub(crate) enum PageArg {
    Int(i64),
    Text(String),
}

/// The page query `q` as SQL with numbered placeholders (`?N` for SQLite,
/// `$N` for PostgreSQL) and their values, or none when nothing can match
/// (an empty list of states). Only the filters asked for are in it, so
/// each shape is planned for what it filters on: the id range always
/// (the primary key), the tenant's index when a tenant lists.
pub(crate) fn job_page_sql(q: &JobPageQuery, postgres: bool) -> Option<(String, Vec<PageArg>)> {
    let mut args: Vec<PageArg> = Vec::new();
    let mut arg = |value: PageArg| {
        args.push(value);
        format!("{}{}", if postgres { '$' } else { '?' }, args.len())
    };
    let clamp = |n: u64| n.min(i64::MAX as u64) as i64;
    let mut sql = String::from("SELECT record FROM jobs WHERE ");
    match q.desc {
        false => {
            let from = q.cursor.map_or(0, |c| c.0.saturating_add(1));
            sql += &format!("id >= {}", arg(PageArg::Int(clamp(from))));
        }
        true => {
            let below = q.cursor.map_or(u64::MAX, |c| c.0);
            sql += &format!("id < {}", arg(PageArg::Int(clamp(below))));
        }
    }
    if let Some(tenant) = q.tenant {
        sql += &format!(" AND tenant = {}", arg(PageArg::Int(i64::from(tenant.0))));
    }
    if let Some(tier) = &q.tier {
        sql += &format!(" AND tier = {}", arg(PageArg::Text(tier.clone())));
    }
    if let Some(name) = &q.name {
        let find = if postgres { "strpos" } else { "instr" };
        sql += &format!(" AND {find}(COALESCE(name, ''), {}) > 0", arg(PageArg::Text(name.clone())));
    }
    if q.collapse {
        sql += " AND (array_id IS NULL OR array_id = id)";
    }
    if let Some(states) = &q.states {
        if states.is_empty() {
            return None;
        }
        let list: Vec<String> = states.iter().map(|s| arg(PageArg::Text(s.clone()))).collect();
        let job =
            if postgres { finished_or_not(states, &list) } else { format!("state IN ({})", list.join(", ")) };
        let list = list.join(", ");
        sql += &match q.collapse {
            false => format!(" AND {job}"),
            true => format!(
                " AND ((array_id IS NULL AND {job}) OR (array_id IS NOT NULL AND EXISTS \
                 (SELECT 1 FROM jobs AS task WHERE task.array_id = jobs.id AND task.state IN ({list}))))"
            ),
        };
    }
    let order = if q.desc { "DESC" } else { "ASC" };
    let limit = arg(PageArg::Int(clamp(q.limit as u64)));
    sql += &format!(" ORDER BY id {order} LIMIT {limit}");
    Some((sql, args))
}

/// PostgreSQL's condition for a job in one of `states` (bound as
/// `placeholders`): no index of its `jobs` holds the state, so that a
/// running job's updates leave the indices alone (schema step 10); a
/// finished state is searched by `finished` (set once, when the job
/// ends), the others among the unfinished jobs (`finished IS NULL`), each
/// an index's range.
fn finished_or_not(states: &[String], placeholders: &[String]) -> String {
    let (done, other): (Vec<_>, Vec<_>) =
        states.iter().zip(placeholders).partition(|(s, _)| FINISHED_STATES.contains(&s.as_str()));
    let list =
        |v: Vec<(&String, &String)>| v.into_iter().map(|(_, p)| p.as_str()).collect::<Vec<_>>().join(", ");
    match (done.is_empty(), other.is_empty()) {
        (true, _) => format!("finished IS NULL AND state IN ({})", list(other)),
        (false, true) => format!("finished IN ({})", list(done)),
        (false, false) => {
            format!("(finished IN ({}) OR (finished IS NULL AND state IN ({})))", list(done), list(other))
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn state() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec![
                "queued",
                "starting",
                "running",
                "draining",
                "succeeded",
                "failed",
                "cancelled"
            ])
            .prop_map(String::from),
            ".{0,12}",
        ]
    }

    proptest! {
        /// Whatever states a listing asks for (known or not, repeated, in
        /// any order), PostgreSQL's query binds each once, as a value, and
        /// numbers its placeholders without a gap: what SQLite's binds.
        #[test]
        fn any_states_are_bound_not_written(
            states in prop::collection::vec(state(), 1..12),
            collapse: bool,
            desc: bool,
        ) {
            let q = JobPageQuery { states: Some(states.clone()), collapse, desc, limit: 10, ..Default::default() };
            let (sql, args) = job_page_sql(&q, true).expect("a query");
            let (_, lite) = job_page_sql(&q, false).expect("a query");
            prop_assert_eq!(args.len(), lite.len());
            let bound: Vec<&str> = args.iter().filter_map(|a| match a { PageArg::Text(t) => Some(t.as_str()), _ => None }).collect();
            prop_assert_eq!(bound, states.iter().map(String::as_str).collect::<Vec<_>>());
            for n in 1..=args.len() {
                prop_assert!(sql.contains(&format!("${n}")), "${} missing from {}", n, sql);
            }
            prop_assert!(!sql.contains(&format!("${}", args.len() + 1)), "{}", sql);
            for s in states.iter().filter(|s| !s.is_empty()) {
                prop_assert!(!sql.contains(&format!("'{s}'")), "{} written into {}", s, sql);
            }
        }
    }
}

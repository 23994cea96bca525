//! The job table: the records the writer keeps in memory, what falls due
//! for them, and the counts kept as they are saved. One part of the
//! writer (`Engine::jobs`), so that a handler that takes it shows it
//! touches jobs and nothing else of the writer's.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use ebb_core::{Attempt, JobId};

use super::due::Due;
use super::job::{JobRecord, JobState, Tally};

/// The records of jobs not finished, and of those finished less than
/// `keep_finished` ago, by id. Every record is in the store too, written in
/// the batch that changed it: the listing, arrays' progress and finished
/// jobs are read from there. Boxed: a map filled in id order leaves its
/// nodes half empty, and a record is hundreds of bytes.
pub(super) struct JobTable {
    records: BTreeMap<JobId, Box<JobRecord>>,
    /// The id the next job gets.
    pub next: JobId,
    /// Finished jobs still in the table, by when they finished: they leave
    /// it `keep_finished` later (one read back from the store for a
    /// request, stamped 0, at the end of that batch).
    pub finished: Due<JobId>,
    /// Jobs in a restart back-off, by when they may run again.
    pub backoff: Due<JobId>,
    /// Deadline jobs not yet promoted, by when to judge them again.
    pub deadlines: Due<JobId>,
    /// Gangs one of whose parts exited 0, by when the rest are stopped if
    /// they have not exited (`JobRecord::gang_grace_until`).
    pub gang_graces: Due<JobId>,
    /// Attempts drained or cancelled before they started (pulling their
    /// image), by when the server ends them whatever their agent says:
    /// their deadline and [`super::exits::UNSTARTED_GRACE_MS`].
    pub unstarted: Due<(JobId, Attempt)>,
    /// Queued jobs whose start was sent ahead to their held GPUs' node.
    pub staged: BTreeSet<JobId>,
    /// Jobs by tier and state, counted as records are saved.
    pub tally: Tally,
    /// How much of each unfinished job's log is committed, once output came.
    pub logs: HashMap<JobId, crate::store::LogState>,
}

/// What saving a record changed in the table: whether the job has just
/// finished, and the state the store held for it before.
pub(super) struct Saved {
    pub finishing: bool,
    pub stored_state: Option<JobState>,
}

impl JobTable {
    pub fn new(next: JobId) -> JobTable {
        JobTable {
            records: BTreeMap::new(),
            next,
            finished: Due::default(),
            backoff: Due::default(),
            deadlines: Due::default(),
            gang_graces: Due::default(),
            unstarted: Due::default(),
            staged: BTreeSet::new(),
            logs: HashMap::new(),
            tally: Tally::default(),
        }
    }

    pub fn get(&self, id: &JobId) -> Option<&JobRecord> {
        self.records.get(id).map(|job| &**job)
    }

    pub fn get_mut(&mut self, id: &JobId) -> Option<&mut JobRecord> {
        self.records.get_mut(id).map(|job| &mut **job)
    }

    pub fn contains_key(&self, id: &JobId) -> bool {
        self.records.contains_key(id)
    }

    pub fn insert(&mut self, id: JobId, job: Box<JobRecord>) {
        self.records.insert(id, job);
    }

    pub fn remove(&mut self, id: &JobId) -> Option<Box<JobRecord>> {
        self.records.remove(id)
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn values(&self) -> impl Iterator<Item = &JobRecord> {
        self.records.values().map(|job| &**job)
    }

    /// The id for a new job.
    pub fn mint(&mut self) -> JobId {
        let id = self.next;
        self.next = id.next();
        id
    }

    /// Job `id`'s live attempt, drained or cancelled before it started,
    /// is ended by the server once its deadline (and grace) has passed.
    pub fn note_unstarted(&mut self, id: JobId) {
        let job = &self.records[&id];
        if let Some(at_ms) = super::exits::unstarted_due(job) {
            self.unstarted.insert(at_ms, (id, job.attempt));
        }
    }

    /// Job `id` is being saved at `now`: it is counted as it is now, and
    /// one that has just finished leaves the table `keep_finished` later.
    pub fn saved(&mut self, id: JobId, now: u64) -> Saved {
        let job = self.records.get_mut(&id).expect("a saved job is in the table");
        // What it was counted as is what it was stored as.
        let stored_state = job.counted.map(|(_, state, _, _)| state);
        self.tally.count(job);
        let finishing = job.state.is_final() && !stored_state.is_some_and(JobState::is_final);
        if finishing {
            self.finished.insert(now, id);
        }
        Saved { finishing, stored_state }
    }
}

impl std::ops::Index<&JobId> for JobTable {
    type Output = JobRecord;

    fn index(&self, id: &JobId) -> &JobRecord {
        self.get(id).expect("a job in the table")
    }
}

type Records<'a> = std::collections::btree_map::Iter<'a, JobId, Box<JobRecord>>;
type Unboxed<'a> = fn((&'a JobId, &'a Box<JobRecord>)) -> (&'a JobId, &'a JobRecord);

impl<'a> IntoIterator for &'a JobTable {
    type Item = (&'a JobId, &'a JobRecord);
    type IntoIter = std::iter::Map<Records<'a>, Unboxed<'a>>;

    fn into_iter(self) -> Self::IntoIter {
        self.records.iter().map(|(id, job)| (id, &**job))
    }
}

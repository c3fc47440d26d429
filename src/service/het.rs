//! A heterogeneous job is one job on the network: one JobConfig keyed by its leader
//! (`<SLURM_HET_JOB_ID>@<cluster>`), on the union of the nodes of its components that run.
//!
//! slurmctld runs PrologSlurmctld and EpilogSlurmctld once per component, each under the
//! component's own job id, and jobcomp posts one record per component. Each of those events
//! is queued under the leader's key ([`crate::job_end::HookEnv::key`]) and marked with
//! the component it came from ([`HetPart`]): one key, so one worker sends them in order and
//! the outbox's rules (the later state wins, no RUNNING after the end) hold for the job as a
//! whole. The record itself is composed as it is sent ([`compose`]), from Slurm's record of
//! every component ([`crate::slurm::het_components`], by the leader's id, bounded), never
//! in the hook: a component's hook knows only its own nodes.
//!
//! Which event is which: every component's prolog and a component other than the leader
//! ending alone (`scancel <leader>+1`, its epilog or jobcomp record: [`HetPart::left`]) are
//! RUNNING events of the job, ranked as RUNNINGs; the leader's end (offset 0) is the job's
//! end, since slurmctld ends every component with its leader (`job_complete`, and a signal to
//! the leader signals every component: `job_mgr.c`, "HetJob leader. Attempt to signal all
//! components").

use crate::cloudvision::payload::{JobConfig, JobState};
use crate::slurm::JobInfo;
use crate::state::event::HetPart;
use crate::timefmt::format_epoch;

/// The mark of an event built from Slurm's record `info` of a heterogeneous job's component
/// (reconciliation, verification, catch-up, `send`): `None` for any other job.
pub fn part_of(info: &JobInfo) -> Option<HetPart> {
    info.het_job_id.as_ref()?;
    Some(HetPart {
        component: info.job_id.clone(),
        offset: info.het_job_offset.unwrap_or(0),
        left: false,
    })
}

/// Is `info` a component of a heterogeneous job other than its leader? No record is ever
/// keyed by such a component's id: the job is its leader's.
pub fn is_follower(info: &JobInfo) -> bool {
    info.het_job_offset.is_some_and(|o| o > 0)
        || info.het_job_id.as_ref().is_some_and(|l| *l != info.job_id)
}

/// What to do with a component's event, given Slurm's record of every component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Composed {
    /// Send this record (keyed by the leader).
    Send(JobConfig),
    /// Send nothing: the reason, for the log.
    Drop(String),
}

/// Is this component running (its nodes are the job's now)?
fn runs(c: &JobInfo) -> bool {
    let word = c.state.split_whitespace().next().unwrap_or("");
    matches!(word, "RUNNING" | "SUSPENDED" | "CONFIGURING") && !c.completing()
}

/// The union of the nodes of `members`, in component order, each node once.
fn union<'a>(members: impl Iterator<Item = &'a JobInfo>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for c in members {
        for n in c.nodes().unwrap_or_default() {
            if !out.contains(&n) {
                out.push(n);
            }
        }
    }
    out
}

/// The record to send for `job`, an event of component `part` keyed by its leader, from
/// `components`, Slurm's records of every component of the job (empty when Slurm could not
/// say):
/// - a RUNNING: the union of the nodes of the components that run, started at the leader's
///   start; nothing when the leader no longer runs (the job is ending: its end follows,
///   from the leader's epilog, its jobcomp record or reconciliation);
/// - the end: the union of the nodes of the components that ran until the end (those that
///   had not ended before the leader), ended at the last component's end; its state is the
///   event's, settled against the leader's record, which is Slurm's record of the whole job.
///
/// Without Slurm's records a component's own RUNNING and the leader's end go as queued (the
/// leader's key, that component's nodes), and a component's leaving goes nowhere: its nodes
/// are the ones the job no longer has.
pub fn compose(job: &JobConfig, part: &HetPart, components: &[JobInfo]) -> Composed {
    let leader = components.iter().find(|c| c.het_job_offset == Some(0));
    let Some(leader) = leader else {
        if part.left {
            return Composed::Drop(format!(
                "component {} left, and Slurm holds no record of the job's components",
                part.component
            ));
        }
        return Composed::Send(job.clone());
    };
    let mut out = job.clone();
    // The job's name is its leader's (components may run in other partitions).
    if !leader.name.is_empty() || leader.partition.is_some() {
        out.name = Some(crate::cloudvision::payload::job_name(
            &leader.name,
            leader.partition.as_deref(),
        ));
    }
    if job.state == JobState::Running {
        if !runs(leader) {
            return Composed::Drop(format!(
                "the job is ending (its leader is {}): its end follows",
                leader.state
            ));
        }
        let nodes = union(components.iter().filter(|c| runs(c)));
        if let Some(start) = leader.start.and_then(format_epoch) {
            out.start_time = Some(start);
        }
        if !nodes.is_empty() && out.interfaces.is_none() {
            out.nodes = Some(nodes.into());
        }
        return Composed::Send(out);
    }
    let stayed = |c: &&JobInfo| {
        c.het_job_offset == Some(0)
            || !c.ended()
            || match (c.end, leader.end) {
                (Some(e), Some(l)) => e >= l,
                _ => true,
            }
    };
    let nodes = union(components.iter().filter(stayed));
    if !nodes.is_empty() && out.interfaces.is_none() {
        out.nodes = Some(nodes.into());
    }
    let last = components
        .iter()
        .filter(stayed)
        .filter_map(|c| c.end)
        .filter(|e| *e <= crate::timefmt::now_epoch())
        .max()
        .and_then(format_epoch);
    if let (Some(last), Some(end)) = (last, out.end_time.as_ref()) {
        // The same format throughout: the text orders as the times do.
        if last > *end && out.start_time.as_ref().is_none_or(|s| last >= *s) {
            out.end_time = Some(last);
        }
    }
    Composed::Send(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloudvision::payload::Key;

    fn comp(id: u32, offset: u32, state: &str, nodes: &str, end: Option<i64>) -> JobInfo {
        JobInfo {
            job_id: id.to_string(),
            name: "hetjob".into(),
            state: state.into(),
            states: vec![state.into()],
            start: Some(1_700_000_000),
            end,
            nodelist: Some(nodes.into()),
            het_job_id: Some("6".into()),
            het_job_offset: Some(offset),
            ..JobInfo::default()
        }
    }

    fn event(state: JobState, nodes: &[&str]) -> JobConfig {
        JobConfig {
            key: Key { id: "6@c".into() },
            name: Some("hetjob@debug".into()),
            state,
            start_time: Some("2023-11-14T22:13:21Z".into()),
            end_time: state
                .is_terminal()
                .then(|| "2023-11-14T22:14:00Z".to_string()),
            location: Some("c".into()),
            job_type: None,
            nodes: Some(
                nodes
                    .iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .into(),
            ),
            interfaces: None,
        }
    }

    fn part(component: &str, offset: u32, left: bool) -> HetPart {
        HetPart {
            component: component.into(),
            offset,
            left,
        }
    }

    fn nodes(c: &Composed) -> Vec<String> {
        match c {
            Composed::Send(j) => j.nodes.clone().unwrap().values,
            Composed::Drop(why) => panic!("dropped: {why}"),
        }
    }

    /// Every component's RUNNING is the job's, on the nodes of all that run.
    #[test]
    fn a_running_job_is_on_the_union_of_its_components() {
        let all = [
            comp(6, 0, "RUNNING", "n4", None),
            comp(7, 1, "RUNNING", "n[1-2]", None),
            comp(8, 2, "RUNNING", "n2,n3", None),
        ];
        for (id, offset) in [("6", 0), ("7", 1), ("8", 2)] {
            let c = compose(
                &event(JobState::Running, &["n9"]),
                &part(id, offset, false),
                &all,
            );
            assert_eq!(nodes(&c), ["n4", "n1", "n2", "n3"]);
            let Composed::Send(j) = c else { unreachable!() };
            assert_eq!(j.key.id, "6@c");
            assert_eq!(j.state, JobState::Running);
            assert_eq!(j.start_time.as_deref(), Some("2023-11-14T22:13:20Z"));
        }
        // A component that does not run adds no node; the name is the leader's.
        let mut some = all.clone();
        some[2].state = "PENDING".into();
        some[2].states = vec!["PENDING".into()];
        some[0].partition = Some("debug".into());
        some[1].partition = Some("gpu".into());
        let mut from_gpu = event(JobState::Running, &["n1"]);
        from_gpu.name = Some("hetjob@gpu".into());
        let c = compose(&from_gpu, &part("7", 1, false), &some);
        assert_eq!(nodes(&c), ["n4", "n1", "n2"]);
        let Composed::Send(j) = c else { unreachable!() };
        assert_eq!(j.name.as_deref(), Some("hetjob@debug"));
    }

    /// A component cancelled alone shrinks the job; the leader's end ends it, on the nodes that
    /// ran to the end, at the last end.
    #[test]
    fn a_component_that_leaves_shrinks_the_job_and_the_leader_ends_it() {
        let mut all = vec![
            comp(6, 0, "RUNNING", "n4", None),
            comp(7, 1, "CANCELLED", "n[1-2]", Some(1_700_000_010)),
            comp(8, 2, "RUNNING", "n3", None),
        ];
        all[1].states = vec!["CANCELLED".into(), "COMPLETING".into()];
        let left = compose(
            &event(JobState::Running, &["n1", "n2"]),
            &part("7", 1, true),
            &all,
        );
        assert_eq!(nodes(&left), ["n4", "n3"]);
        // The job ends: the leader and the component still running end together.
        all[0] = comp(6, 0, "COMPLETED", "n4", Some(1_700_000_050));
        all[2] = comp(8, 2, "COMPLETED", "n3", Some(1_700_000_051));
        let end = compose(
            &event(JobState::Completed, &["n4"]),
            &part("6", 0, false),
            &all,
        );
        assert_eq!(nodes(&end), ["n4", "n3"]);
        let Composed::Send(j) = end else {
            unreachable!()
        };
        assert_eq!(j.state, JobState::Completed);
        assert_eq!(j.end_time.as_deref(), Some("2023-11-14T22:14:11Z"));
        // A RUNNING composed once the leader has ended sends nothing: the end follows.
        let late = compose(
            &event(JobState::Running, &["n3"]),
            &part("8", 2, false),
            &all,
        );
        assert!(matches!(late, Composed::Drop(_)), "{late:?}");
        let mut completing = all.clone();
        completing[0].state = "COMPLETING".into();
        completing[0].states = vec!["COMPLETING".into()];
        let late = compose(
            &event(JobState::Running, &["n3"]),
            &part("8", 2, true),
            &completing,
        );
        assert!(matches!(late, Composed::Drop(_)), "{late:?}");
    }

    /// One key for every component: the outbox orders them as one job's events. Two
    /// components' RUNNINGs are one pending event; the leader's end goes after it; a
    /// component's leaving that comes after the end (every component's epilog runs at the
    /// end, in any order) is outranked and never sent after it.
    #[test]
    fn the_outbox_orders_every_component_as_one_job() {
        use crate::state::queue::{Enqueued, Event, Item};
        let d = std::env::temp_dir().join(format!("cvslurm-het-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        let outbox = crate::state::StateDir::new(&d);
        let ev = |state, rank, component: &str, offset, left| {
            let mut e = Event::new(
                Item::Job {
                    job: event(state, &["n1"]),
                },
                rank,
            );
            e.het = Some(part(component, offset, left));
            e
        };
        let q = &outbox.queue;
        let run0 = ev(JobState::Running, (0, 0), "6", 0, false);
        let run1 = ev(JobState::Running, (0, 0), "7", 1, false);
        assert!(matches!(q.enqueue(&run0), Ok(Enqueued::Queued { .. })));
        assert!(matches!(q.enqueue(&run1), Ok(Enqueued::Queued { .. })));
        assert_eq!(q.pending(), vec![run1], "one pending event for the job");
        let end = ev(JobState::Completed, (0, 1), "6", 0, false);
        assert_eq!(q.enqueue(&end), Ok(Enqueued::Chained));
        let late = ev(JobState::Running, (0, 0), "7", 1, true);
        assert_eq!(q.enqueue(&late), Ok(Enqueued::Superseded));
        let pending = q.pending();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].then.as_deref(), Some(&end));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Without Slurm's records: a RUNNING or the leader's end as queued (the leader's key),
    /// a component's leaving nowhere.
    #[test]
    fn without_slurms_records_nothing_is_made_up() {
        let run = event(JobState::Running, &["n4"]);
        assert_eq!(
            compose(&run, &part("6", 0, false), &[]),
            Composed::Send(run.clone())
        );
        let end = event(JobState::Cancelled, &["n4"]);
        assert_eq!(
            compose(&end, &part("6", 0, false), &[]),
            Composed::Send(end.clone())
        );
        let left = event(JobState::Running, &["n1"]);
        assert!(matches!(
            compose(&left, &part("7", 1, true), &[]),
            Composed::Drop(_)
        ));
    }
}

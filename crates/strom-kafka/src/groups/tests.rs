//! The group coordinator's tests: joins, syncs, rebalances, the initial
//! wait, static members, limits and retention, driven with explicit times.

use super::*;

fn req(member: &str) -> JoinRequest {
    JoinRequest {
        group: "g".into(),
        member_id: member.into(),
        instance: None,
        client_id: "c".into(),
        session: Duration::from_secs(10),
        rebalance: Duration::from_secs(10),
        protocol_type: "consumer".into(),
        protocols: vec![("range".into(), Bytes::from_static(b"sub"))],
    }
}

#[test]
fn two_members_join_sync_and_rebalance_when_one_leaves() {
    let c = Coordinator::new(Duration::from_secs(60), 10, Duration::ZERO);
    let a = c
        .join(req(""))
        .try_recv()
        .expect("alone: completes at once");
    assert_eq!((a.error, a.generation), (kcode::NONE, 1));
    assert_eq!(a.leader, a.member_id);
    // A second member: a rebalance; the first learns it by heartbeat.
    let mut b_rx = c.join(req(""));
    assert!(b_rx.try_recv().is_err(), "waits for the first to rejoin");
    assert_eq!(
        c.heartbeat("g", 1, &a.member_id),
        gcode::REBALANCE_IN_PROGRESS
    );
    // Before it rejoins, it may still commit what it read.
    assert_eq!(c.check_commit("g", 1, &a.member_id), kcode::NONE);
    let a2 = c.join(req(&a.member_id)).try_recv().expect("completes");
    let b = b_rx.try_recv().expect("completes");
    assert_eq!((a2.generation, b.generation), (2, 2));
    assert_eq!(a2.members.len(), 2, "the leader gets the subscriptions");
    assert!(b.members.is_empty());
    // No commits while the new assignment is handed out.
    assert_eq!(
        c.check_commit("g", 2, &a.member_id),
        gcode::REBALANCE_IN_PROGRESS
    );
    // The follower waits for the leader's assignment.
    let mut fb = c.sync("g", 2, &b.member_id, vec![]);
    assert!(fb.try_recv().is_err());
    let la = c.sync(
        "g",
        2,
        &a.member_id,
        vec![
            (a.member_id.clone(), Bytes::from_static(b"A")),
            (b.member_id.clone(), Bytes::from_static(b"B")),
        ],
    );
    assert_eq!(
        la.blocking_recv().expect("answer").1,
        Bytes::from_static(b"A")
    );
    assert_eq!(fb.try_recv().expect("answer").1, Bytes::from_static(b"B"));
    assert_eq!(c.heartbeat("g", 2, &b.member_id), kcode::NONE);
    assert_eq!(c.check_commit("g", 2, &b.member_id), kcode::NONE);
    // One leaves: the other is told to rejoin and is alone at gen 3.
    assert_eq!(c.leave("g", &a.member_id), kcode::NONE);
    assert_eq!(
        c.heartbeat("g", 2, &b.member_id),
        gcode::REBALANCE_IN_PROGRESS
    );
    let b3 = c.join(req(&b.member_id)).try_recv().expect("completes");
    assert_eq!((b3.generation, b3.leader.clone()), (3, b.member_id.clone()));
    assert_eq!(
        c.check_commit("g", 2, &b.member_id),
        gcode::ILLEGAL_GENERATION
    );
}

#[test]
fn a_full_group_refuses_a_new_member() {
    let c = Coordinator::new(Duration::from_secs(60), 2, Duration::ZERO);
    let a = c.join(req("")).try_recv().expect("alone: at once");
    let _b = c.join(req(""));
    let refused = c.join(req("")).try_recv().expect("refused at once");
    assert_eq!(refused.error, gcode::GROUP_MAX_SIZE_REACHED);
    // A known member rejoining is not a new one.
    let mut again = c.join(req(&a.member_id));
    assert!(!matches!(again.try_recv(), Ok(j) if j.error == gcode::GROUP_MAX_SIZE_REACHED));
}

#[test]
fn an_empty_group_is_forgotten_after_the_retention() {
    let c = Coordinator::new(Duration::ZERO, 10, Duration::ZERO);
    let a = c.join(req("")).try_recv().expect("alone: at once");
    c.tick();
    assert!(c.take_expired().is_empty(), "a group with a member stays");
    assert_eq!(c.leave("g", &a.member_id), kcode::NONE);
    c.tick();
    assert_eq!(c.take_expired(), vec!["g".to_string()]);
    assert!(c.list().is_empty());
    assert!(c.take_expired().is_empty(), "handed out once");
}

#[test]
fn the_first_rebalance_of_an_empty_group_waits_for_more_members() {
    let delay = Duration::from_secs(3);
    let ms = Duration::from_millis;
    let c = Coordinator::new(Duration::from_secs(60), 10, delay);
    let t0 = Instant::now();
    let mut a = c.join(req(""));
    let mut b = c.join(req(""));
    c.tick_at(t0 + ms(2_500));
    assert!(a.try_recv().is_err(), "waits although every member joined");
    // The second joined during the first round of a new group: one
    // round more (the rebalance timeout, 10 s, leaves room for it).
    c.tick_at(t0 + delay + ms(500));
    assert!(a.try_recv().is_err(), "a newcomer extends the wait");
    c.tick_at(t0 + delay * 2 + ms(500));
    let (a, b) = (a.try_recv().expect("done"), b.try_recv().expect("done"));
    assert_eq!((a.generation, b.generation), (1, 1));
    let leader = if a.leader == a.member_id { &a } else { &b };
    assert_eq!(leader.members.len(), 2, "one generation with both");

    // A rebalance of a group with members does not wait.
    let mut x = c.join(req(""));
    let _a2 = c.join(req(&a.member_id));
    let _b2 = c.join(req(&b.member_id));
    assert_eq!(x.try_recv().expect("at once").generation, 2);

    // Empty again: the next first rebalance waits once, not extended
    // by newcomers (as Kafka: only while the generation is 0).
    for m in [&a.member_id, &b.member_id] {
        assert_eq!(c.leave("g", m), kcode::NONE);
    }
    let members: Vec<String> = c
        .describe("g")
        .expect("known")
        .members
        .into_iter()
        .map(|m| m.id)
        .collect();
    for m in members {
        assert_eq!(c.leave("g", &m), kcode::NONE);
    }
    let t1 = Instant::now();
    let mut d = c.join(req(""));
    let mut e = c.join(req(""));
    c.tick_at(t1 + ms(2_500));
    assert!(d.try_recv().is_err(), "waits");
    c.tick_at(t1 + delay + ms(500));
    assert_eq!(d.try_recv().expect("done").generation, 3);
    assert_eq!(e.try_recv().expect("done").generation, 3);
}

#[test]
fn a_restarted_static_member_takes_its_old_place_at_once() {
    let c = Coordinator::new(Duration::from_secs(60), 10, Duration::ZERO);
    let static_req = |member: &str, instance: &str| JoinRequest {
        instance: Some(instance.into()),
        ..req(member)
    };
    let a = c
        .join(static_req("", "i0"))
        .try_recv()
        .expect("alone: at once");
    let mut b = c.join(static_req("", "i1"));
    // a rejoins for the rebalance b started; both complete.
    let a = c
        .join(static_req(&a.member_id, "i0"))
        .try_recv()
        .expect("joined");
    let b = b.try_recv().expect("joined");
    assert_eq!((a.generation, b.generation), (2, 2));
    // Both close without leaving (static members do), then restart with
    // their instance ids and no member id: each takes its old place, so
    // the group rebalances as soon as both are back, not after sessions.
    let mut a2 = c.join(static_req("", "i0"));
    assert!(
        a2.try_recv().is_err(),
        "waits for i1's restart, not its session"
    );
    let b2 = c.join(static_req("", "i1")).try_recv().expect("both back");
    let a2 = a2.try_recv().expect("both back");
    assert_eq!((a2.generation, b2.generation), (3, 3));
    assert_ne!(a2.member_id, a.member_id, "a new member id");
    let ids: Vec<String> = c
        .describe("g")
        .expect("known")
        .members
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(ids.len(), 2, "the old incarnations are gone: {ids:?}");
    // The old incarnation is no longer a member.
    assert_eq!(c.leave("g", &a.member_id), gcode::UNKNOWN_MEMBER_ID);
}

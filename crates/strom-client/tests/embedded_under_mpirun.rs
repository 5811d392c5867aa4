//! `Driver::embedded` inside an MPI job: the launcher's rank variables (here
//! Open MPI's, as `mpirun -n 4` sets them) must not turn the in-process
//! server into a rank of a launched group, which would refuse to start
//! without a group file. Its own test binary, since it sets the process
//! environment before any thread reads it.

use strom_client::{Driver, TopicSpec};

#[test]
fn an_embedded_server_stands_alone_under_mpirun() {
    std::env::set_var("OMPI_COMM_WORLD_RANK", "2");
    std::env::set_var("OMPI_COMM_WORLD_SIZE", "4");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = Driver::embedded(dir.path()).expect("an embedded server starts under mpirun");
    let t = d.create_topic(TopicSpec::new("t", 1)).expect("topic");
    let p = t.producer().expect("producer");
    p.push(serde_json::json!({"rank": 2}), ())
        .expect("push")
        .wait()
        .expect("stored");
    assert_eq!(d.members().expect("members").len(), 1, "a group of one");
}

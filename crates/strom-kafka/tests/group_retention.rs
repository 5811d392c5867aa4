//! A Kafka group the registry kept from before a restart expires too: an
//! in-process server whose registry holds a Kafka-mode group (as its
//! coordinator reported it before stopping) is restarted on the same data
//! dir with a short `kafka_group_retention_ms`; the restarted coordinator
//! adopts the group as empty, and it leaves the registry after the
//! retention.

use std::time::{Duration, Instant};

use strom_proto::{ConsumerGroupMode, ConsumerGroupSpec, TopicSpec};
use strom_server::{Server, ServerConfig};

fn config(dir: &std::path::Path) -> ServerConfig {
    ServerConfig {
        data_dir: dir.join("data"),
        listen: "127.0.0.1:0".into(),
        transforms: false,
        kafka_group_retention_ms: 500,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_group_kept_from_before_a_restart_expires() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(config(dir.path())).await.expect("server");
    let services = server.services();
    let reg = services.control.registry().expect("the master");
    reg.create(TopicSpec::new("t", 1), None)
        .await
        .expect("topic");
    let kafka = ConsumerGroupSpec::new("old-kafka", "t", ConsumerGroupMode::Kafka);
    reg.kafka_group_view(kafka, 1, Vec::new())
        .await
        .expect("a Kafka group in the registry");
    drop(services);
    server.shutdown().await;

    let server = Server::start(config(dir.path())).await.expect("restart");
    let services = server.services();
    let kafka = strom_kafka::serve(services.clone(), "127.0.0.1:0")
        .await
        .expect("kafka");
    let reg = services.control.registry().expect("the master");
    let names = |groups: Vec<strom_proto::ConsumerGroupInfo>| {
        let mut n: Vec<String> = groups.into_iter().map(|g| g.spec.name).collect();
        n.sort();
        n
    };
    assert_eq!(names(reg.list_groups().await), ["old-kafka"]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !reg.list_groups().await.is_empty() {
        assert!(
            Instant::now() < deadline,
            "the old Kafka group did not expire: {:?}",
            names(reg.list_groups().await)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    kafka.shutdown().await;
    server.shutdown().await;
}

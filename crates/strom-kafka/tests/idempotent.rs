//! An idempotent producer's retried batch is not stored twice: an
//! in-process server with the Kafka listener, the same Produce (producer
//! id 5, sequence 0) sent twice over raw TCP; both answers name offset 0
//! and the partition holds the records once. A gap in the sequence is
//! refused with OUT_OF_ORDER_SEQUENCE_NUMBER. A batch of a newer producer
//! epoch numbered from 0 again (what Kafka's Java producer sends after it
//! bumps its epoch) is stored, not taken for a retry; one of an older epoch
//! is refused with INVALID_PRODUCER_EPOCH.

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use strom_proto::TopicSpec;
use strom_server::{Server, ServerConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn batch(seq: i32) -> Bytes {
    batch_at(0, seq)
}

fn batch_at(epoch: i16, seq: i32) -> Bytes {
    let recs: Vec<Record> = (0..3)
        .map(|i| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: 5,
            producer_epoch: epoch,
            timestamp_type: TimestampType::Creation,
            offset: i,
            sequence: seq + i as i32,
            timestamp: 1000,
            key: None,
            value: Some(Bytes::from(vec![b'v'; 10])),
            headers: IndexMap::new(),
        })
        .collect();
    let mut out = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut out,
        recs.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .expect("encoding");
    out.freeze()
}

/// Produce v3 of `records` to t/0; returns (error code, base offset).
async fn produce(s: &mut TcpStream, corr: i32, records: &[u8]) -> (i16, i64) {
    let mut f = Vec::new();
    f.extend_from_slice(&0i16.to_be_bytes());
    f.extend_from_slice(&3i16.to_be_bytes());
    f.extend_from_slice(&corr.to_be_bytes());
    f.extend_from_slice(&(-1i16).to_be_bytes());
    f.extend_from_slice(&(-1i16).to_be_bytes()); // transactional id
    f.extend_from_slice(&(-1i16).to_be_bytes()); // acks all
    f.extend_from_slice(&5000i32.to_be_bytes());
    f.extend_from_slice(&1i32.to_be_bytes());
    f.extend_from_slice(&1i16.to_be_bytes());
    f.push(b't');
    f.extend_from_slice(&1i32.to_be_bytes());
    f.extend_from_slice(&0i32.to_be_bytes());
    f.extend_from_slice(&(records.len() as i32).to_be_bytes());
    f.extend_from_slice(records);
    s.write_all(&(f.len() as i32).to_be_bytes()).await.unwrap();
    s.write_all(&f).await.unwrap();
    let n = s.read_i32().await.expect("a response");
    let mut r = vec![0u8; n as usize];
    s.read_exact(&mut r).await.unwrap();
    // corr, topics(1), "t", partitions(1), index, error, base offset
    let at = 4 + 4 + 3 + 4 + 4;
    let code = i16::from_be_bytes([r[at], r[at + 1]]);
    let off = i64::from_be_bytes(r[at + 2..at + 10].try_into().unwrap());
    (code, off)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_idempotent_batch_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig {
        data_dir: dir.path().join("data"),
        listen: "127.0.0.1:0".into(),
        ..Default::default()
    };
    let server = Server::start(config).await.expect("server");
    let services = server.services();
    services
        .control
        .registry()
        .expect("the master")
        .create(TopicSpec::new("t", 1), None)
        .await
        .expect("topic");
    let kafka = strom_kafka::serve(services.clone(), "127.0.0.1:0")
        .await
        .expect("kafka");
    let mut s = TcpStream::connect(kafka.addr()).await.unwrap();
    let first = batch(0);
    assert_eq!(produce(&mut s, 1, &first).await, (0, 0));
    assert_eq!(
        produce(&mut s, 2, &first).await,
        (0, 0),
        "the retry gets the first offset"
    );
    assert_eq!(produce(&mut s, 3, &batch(3)).await, (0, 3));
    let (code, _) = produce(&mut s, 4, &batch(9)).await;
    assert_eq!(code, 45, "OUT_OF_ORDER_SEQUENCE_NUMBER");
    let p = services.data.partition("t", 0).unwrap();
    assert_eq!(p.next_offset(), 6, "six records stored, none twice");
    // The producer bumps its epoch and numbers from 0 again: new records.
    assert_eq!(produce(&mut s, 5, &batch_at(1, 0)).await, (0, 6));
    assert_eq!(
        produce(&mut s, 6, &batch_at(1, 0)).await,
        (0, 6),
        "a retry within the new epoch"
    );
    assert_eq!(produce(&mut s, 7, &batch_at(1, 3)).await, (0, 9));
    let (code, _) = produce(&mut s, 8, &batch_at(0, 6)).await;
    assert_eq!(code, 47, "INVALID_PRODUCER_EPOCH");
    assert_eq!(p.next_offset(), 12, "the new epoch's six records");
    drop(s);
    kafka.shutdown().await;
    server.shutdown().await;
}

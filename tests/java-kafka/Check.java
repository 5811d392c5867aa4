// Kafka's Java clients (org.apache.kafka:kafka-clients) against a Kafka
// broker, here Strom's Kafka front end. Run in single-file source mode:
//
//   java -cp 'target/java-kafka/lib/*' tests/java-kafka/Check.java BOOTSTRAP TOPIC GROUP N [--whole-group-offsets]
//
// a) AdminClient: creates TOPIC with 3 partitions, lists topics, describes
//    the topic and the cluster;
// b) KafkaProducer with default settings (idempotence on, acks=all) and
//    compression.type=lz4: N keyed records with headers, flush, every send
//    succeeded;
// c) KafkaConsumer in GROUP, subscribe(), polls until all N records are
//    read; checks keys, values, headers and per-partition order; commitSync;
// d) listConsumerGroupOffsets for GROUP on TOPIC's partitions equals the end
//    offsets (with --whole-group-offsets, also listConsumerGroupOffsets(GROUP)
//    naming no partitions); beginningOffsets, endOffsets, offsetsForTimes and
//    the admin client's listOffsets are sane;
// e) a new producer sends 100 more records, and a new member of GROUP
//    resumes at the committed offsets and reads exactly those.
//
// With --epoch-bump BOOTSTRAP TOPIC SERVER_PID instead: the idempotent
// producer's own epoch bump after batches expired while the server was
// stopped (SIGSTOP) loses no acknowledged record.
//
// Prints "ok ..." lines and finally "CHECK OK"; exits 1 with "CHECK FAILED:
// reason" on any mismatch. crates/strom-cli/tests/kafka_java.rs runs it;
// scripts/java-kafka.sh fetches the jars.

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public class Check {
    static final int PARTITIONS = 3;
    /** Records added for the resume step (e). */
    static final int RESUME = 100;

    static void fail(String why) {
        System.out.println("CHECK FAILED: " + why);
        System.out.flush();
        System.exit(1);
    }

    static void check(boolean ok, String why) {
        if (!ok) fail(why);
    }

    static String key(int i) { return "key-" + (i % 37); }

    static String value(int i) { return "value-" + i + "-" + "x".repeat(i % 53); }

    public static void main(String[] args) throws Exception {
        boolean epochBump = args.length == 4 && args[0].equals("--epoch-bump");
        boolean wholeGroup = args.length == 5 && args[4].equals("--whole-group-offsets");
        if (args.length != 4 && !wholeGroup) {
            fail("usage: Check BOOTSTRAP TOPIC GROUP N [--whole-group-offsets]\n"
                + "       Check --epoch-bump BOOTSTRAP TOPIC SERVER_PID");
        }
        try {
            if (epochBump) {
                epochBump(args[1], args[2], Long.parseLong(args[3]));
            } else {
                run(args[0], args[1], args[2], Integer.parseInt(args[3]), wholeGroup);
            }
        } catch (Throwable t) {
            t.printStackTrace(System.out);
            fail(t.toString());
        }
        System.out.println("CHECK OK");
        System.out.flush();
        System.exit(0);
    }

    static void run(String bootstrap, String topic, String group, int n, boolean wholeGroup)
        throws Exception {
        Properties common = new Properties();
        common.put("bootstrap.servers", bootstrap);
        // Client settings from -Dcheck.client.NAME=VALUE (security, say).
        for (String name : System.getProperties().stringPropertyNames()) {
            if (name.startsWith("check.client.")) {
                common.put(name.substring("check.client.".length()), System.getProperty(name));
            }
        }
        common.put("request.timeout.ms", "15000");
        common.put("default.api.timeout.ms", "20000");

        // a) Administration.
        try (Admin admin = Admin.create(common)) {
            admin.createTopics(List.of(new NewTopic(topic, PARTITIONS, (short) 1))).all()
                .get(20, TimeUnit.SECONDS);
            Set<String> names = admin.listTopics().names().get(20, TimeUnit.SECONDS);
            check(names.contains(topic), "listTopics " + names + " lacks " + topic);
            TopicDescription td = admin.describeTopics(List.of(topic)).allTopicNames()
                .get(20, TimeUnit.SECONDS).get(topic);
            check(td != null && td.partitions().size() == PARTITIONS,
                "describeTopics: " + td);
            DescribeClusterResult dc = admin.describeCluster();
            Collection<Node> nodes = dc.nodes().get(20, TimeUnit.SECONDS);
            Node controller = dc.controller().get(20, TimeUnit.SECONDS);
            String clusterId = dc.clusterId().get(20, TimeUnit.SECONDS);
            check(!nodes.isEmpty(), "describeCluster: no nodes");
            System.out.println("ok admin: created " + topic + ", " + names.size()
                + " topics, nodes " + nodes + ", controller " + controller
                + ", cluster id " + clusterId);
        }

        // b) The default (idempotent, acks=all) producer, lz4-compressed.
        Properties pp = new Properties();
        pp.putAll(common);
        pp.put("key.serializer", StringSerializer.class.getName());
        pp.put("value.serializer", StringSerializer.class.getName());
        pp.put("compression.type", System.getProperty("check.compression", "lz4"));
        pp.put("linger.ms", "5");
        long before = System.currentTimeMillis();
        produce(pp, topic, 0, n);
        System.out.println("ok produce: " + n + " records acknowledged");

        // c) A group consumer reads everything back.
        Properties cp = new Properties();
        cp.putAll(common);
        cp.put("group.id", group);
        cp.put("key.deserializer", StringDeserializer.class.getName());
        cp.put("value.deserializer", StringDeserializer.class.getName());
        cp.put("auto.offset.reset", "earliest");
        cp.put("enable.auto.commit", "false");
        Map<TopicPartition, Long> positions = consume(cp, topic, 0, n, Map.of(), before);
        System.out.println("ok consume: " + n + " records in order, committed " + positions);

        // d) Offsets, through the admin client and a group-less consumer.
        Properties op = new Properties();
        op.putAll(common);
        op.put("key.deserializer", StringDeserializer.class.getName());
        op.put("value.deserializer", StringDeserializer.class.getName());
        List<TopicPartition> tps = new ArrayList<>();
        for (int p = 0; p < PARTITIONS; p++) tps.add(new TopicPartition(topic, p));
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(op);
             Admin admin = Admin.create(common)) {
            Map<TopicPartition, Long> begin = c.beginningOffsets(tps, Duration.ofSeconds(20));
            Map<TopicPartition, Long> end = c.endOffsets(tps, Duration.ofSeconds(20));
            long total = 0;
            for (TopicPartition tp : tps) {
                check(begin.get(tp) == 0L, "beginningOffsets " + begin);
                total += end.get(tp);
            }
            check(total == n, "endOffsets " + end + " sum to " + total + ", not " + n);
            for (TopicPartition tp : tps) {
                if (end.get(tp) > 0) {
                    check(end.get(tp).equals(positions.get(tp)),
                        "position " + positions + " is not the end " + end);
                }
            }
            // The group's offsets on the topic's partitions (OffsetFetch
            // naming them), and with --whole-group-offsets all of the
            // group's offsets (OffsetFetch naming no topics).
            Map<String, ListConsumerGroupOffsetsSpec> spec = Map.of(group,
                new ListConsumerGroupOffsetsSpec().topicPartitions(tps));
            List<Map<TopicPartition, OffsetAndMetadata>> views = new ArrayList<>();
            views.add(admin.listConsumerGroupOffsets(spec).partitionsToOffsetAndMetadata(group)
                .get(20, TimeUnit.SECONDS));
            if (wholeGroup) {
                views.add(admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata()
                    .get(20, TimeUnit.SECONDS));
            }
            for (Map<TopicPartition, OffsetAndMetadata> committed : views) {
                for (TopicPartition tp : tps) {
                    if (end.get(tp) == 0) continue;
                    OffsetAndMetadata om = committed.get(tp);
                    check(om != null && om.offset() == end.get(tp),
                        "committed " + committed + " differs from the end offsets " + end);
                }
            }
            Map<TopicPartition, Long> early = new HashMap<>(), late = new HashMap<>();
            for (TopicPartition tp : tps) {
                early.put(tp, 0L);
                late.put(tp, System.currentTimeMillis() + 3_600_000L);
            }
            Map<TopicPartition, OffsetAndTimestamp> fromZero = c.offsetsForTimes(early, Duration.ofSeconds(20));
            Map<TopicPartition, OffsetAndTimestamp> fromLate = c.offsetsForTimes(late, Duration.ofSeconds(20));
            for (TopicPartition tp : tps) {
                OffsetAndTimestamp z = fromZero.get(tp);
                if (end.get(tp) > 0) {
                    check(z != null && z.offset() == 0 && z.timestamp() >= before - 1000,
                        "offsetsForTimes(0) for " + tp + ": " + z);
                }
                check(fromLate.get(tp) == null, "offsetsForTimes(in an hour) for " + tp + ": " + fromLate.get(tp));
            }
            Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> latest = admin.listOffsets(
                    Map.of(tps.get(0), OffsetSpec.latest(), tps.get(1), OffsetSpec.latest(),
                        tps.get(2), OffsetSpec.latest()))
                .all().get(20, TimeUnit.SECONDS);
            for (TopicPartition tp : tps) {
                check(latest.get(tp).offset() == end.get(tp),
                    "admin listOffsets(latest) " + latest + " differs from " + end);
            }
            System.out.println("ok offsets: end " + end + ", committed equal, offsetsForTimes sane");
        }

        // e) A new producer adds RESUME records; a new member of the group
        //    resumes at the committed offsets and reads exactly those.
        produce(pp, topic, n, n + RESUME);
        Map<TopicPartition, Long> resumed = consume(cp, topic, n, n + RESUME, positions, before);
        System.out.println("ok resume: " + RESUME + " more records from the committed offsets, committed "
            + resumed);
    }

    /** Sends records from..to-1 and checks that every send succeeded. */
    static void produce(Properties pp, String topic, int from, int to) throws Exception {
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp)) {
            List<Future<RecordMetadata>> sent = new ArrayList<>(to - from);
            for (int i = from; i < to; i++) {
                ProducerRecord<String, String> r = new ProducerRecord<>(topic, key(i), value(i));
                r.headers().add("idx", Integer.toString(i).getBytes(StandardCharsets.UTF_8));
                r.headers().add("src", "java".getBytes(StandardCharsets.UTF_8));
                sent.add(producer.send(r));
            }
            producer.flush();
            for (int i = from; i < to; i++) {
                RecordMetadata md = sent.get(i - from).get(20, TimeUnit.SECONDS);
                check(md.hasOffset() && md.offset() >= 0, "record " + i + ": no offset: " + md);
                check(md.partition() >= 0 && md.partition() < PARTITIONS,
                    "record " + i + ": partition " + md.partition());
            }
        }
    }

    /**
     * Subscribes a member of cp's group and polls until records from..to-1
     * are read, each once, checking key, value, headers, timestamp, dense
     * offsets per partition starting at {@code start} (0 where absent) and
     * per-key order; then commitSync. Returns the positions committed.
     */
    static Map<TopicPartition, Long> consume(Properties cp, String topic, int from, int to,
            Map<TopicPartition, Long> start, long before) {
        int n = to - from;
        Map<TopicPartition, Long> positions = new HashMap<>();
        try (KafkaConsumer<String, String> consumer = new KafkaConsumer<>(cp)) {
            consumer.subscribe(List.of(topic));
            BitSet seen = new BitSet(n);
            Map<Integer, Long> lastOffset = new HashMap<>();
            Map<String, Integer> lastIdxOfKey = new HashMap<>();
            int count = 0;
            long deadline = System.currentTimeMillis() + 40_000;
            while (count < n) {
                check(System.currentTimeMillis() < deadline,
                    "consumed " + count + " of " + n + " records within 40 s");
                for (ConsumerRecord<String, String> r : consumer.poll(Duration.ofMillis(500))) {
                    Header h = r.headers().lastHeader("idx");
                    check(h != null, "record " + r.partition() + "/" + r.offset() + " lacks header idx");
                    int i = Integer.parseInt(new String(h.value(), StandardCharsets.UTF_8));
                    check(i >= from && i < to && !seen.get(i - from),
                        "record index " + i + " unexpected or twice (at " + r.partition() + "/"
                        + r.offset() + ")");
                    seen.set(i - from);
                    count++;
                    check(key(i).equals(r.key()), "record " + i + ": key " + r.key());
                    check(value(i).equals(r.value()), "record " + i + ": value " + r.value());
                    Header src = r.headers().lastHeader("src");
                    check(src != null && "java".equals(new String(src.value(), StandardCharsets.UTF_8)),
                        "record " + i + ": header src");
                    check(r.timestamp() >= before - 1000, "record " + i + ": timestamp " + r.timestamp());
                    Long last = lastOffset.put(r.partition(), r.offset());
                    long first = start.getOrDefault(new TopicPartition(topic, r.partition()), 0L);
                    check(last == null ? r.offset() == first : r.offset() == last + 1,
                        "partition " + r.partition() + ": offset " + r.offset() + " after "
                        + (last == null ? "the start " + first : last));
                    Integer prev = lastIdxOfKey.put(r.key(), i);
                    check(prev == null || prev < i,
                        "key " + r.key() + ": record " + i + " after " + prev + " (order)");
                }
            }
            check(seen.cardinality() == n, "distinct records " + seen.cardinality());
            consumer.commitSync(Duration.ofSeconds(20));
            for (TopicPartition tp : consumer.assignment()) {
                positions.put(tp, consumer.position(tp, Duration.ofSeconds(20)));
            }
        }
        return positions;
    }

    /**
     * The idempotent producer bumps its epoch itself: with the server
     * stopped (SIGSTOP), batches expire after delivery.timeout.ms; the
     * producer then moves to epoch + 1 with the same producer id and numbers
     * its next batches from 0 again. Those must be stored, not taken for
     * retries of the first batches.
     */
    static void epochBump(String bootstrap, String topic, long serverPid) throws Exception {
        Properties pp = new Properties();
        pp.put("bootstrap.servers", bootstrap);
        pp.put("key.serializer", StringSerializer.class.getName());
        pp.put("value.serializer", StringSerializer.class.getName());
        pp.put("linger.ms", "0");
        pp.put("request.timeout.ms", "2500");
        pp.put("delivery.timeout.ms", "5000");
        try (Admin admin = Admin.create(pp)) {
            admin.createTopics(List.of(new NewTopic(topic, 1, (short) 1))).all()
                .get(20, TimeUnit.SECONDS);
        }
        List<String> acked = new ArrayList<>();
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(pp)) {
            for (int i = 0; i < 5; i++) {
                producer.send(new ProducerRecord<>(topic, 0, null, "A" + i)).get(20, TimeUnit.SECONDS);
                acked.add("A" + i);
            }
            int expired = 0;
            signal("STOP", serverPid);
            try {
                List<Future<RecordMetadata>> stalled = new ArrayList<>();
                for (int i = 0; i < 5; i++) {
                    stalled.add(producer.send(new ProducerRecord<>(topic, 0, null, "X" + i)));
                }
                for (Future<RecordMetadata> f : stalled) {
                    try {
                        f.get(30, TimeUnit.SECONDS);
                    } catch (java.util.concurrent.ExecutionException e) {
                        expired++;
                    }
                }
            } finally {
                signal("CONT", serverPid);
            }
            check(expired > 0, "no batch expired while the server was stopped");
            for (int i = 0; i < 5; i++) {
                RecordMetadata md = producer.send(new ProducerRecord<>(topic, 0, null, "B" + i))
                    .get(20, TimeUnit.SECONDS);
                check(md.hasOffset() && md.offset() >= 5,
                    "B" + i + " after the epoch bump acknowledged at offset " + md.offset());
                acked.add("B" + i);
            }
            System.out.println("ok epoch bump: " + expired + " records expired, 5 more acknowledged");
        }
        Properties cp = new Properties();
        cp.put("bootstrap.servers", bootstrap);
        cp.put("key.deserializer", StringDeserializer.class.getName());
        cp.put("value.deserializer", StringDeserializer.class.getName());
        try (KafkaConsumer<String, String> c = new KafkaConsumer<>(cp)) {
            TopicPartition tp = new TopicPartition(topic, 0);
            c.assign(List.of(tp));
            c.seekToBeginning(List.of(tp));
            long end = c.endOffsets(List.of(tp), Duration.ofSeconds(20)).get(tp);
            List<String> stored = new ArrayList<>();
            long deadline = System.currentTimeMillis() + 20_000;
            while (c.position(tp) < end) {
                check(System.currentTimeMillis() < deadline, "reading back: " + stored);
                for (ConsumerRecord<String, String> r : c.poll(Duration.ofMillis(300))) {
                    stored.add(r.value());
                }
            }
            List<String> kept = new ArrayList<>(stored);
            kept.removeIf(v -> v.startsWith("X"));
            check(kept.equals(acked), "stored " + stored + ", acknowledged " + acked);
            System.out.println("ok epoch bump: every acknowledged record stored once: " + stored);
        }
    }

    static void signal(String sig, long pid) throws Exception {
        int rc = new ProcessBuilder("kill", "-" + sig, Long.toString(pid)).inheritIO().start().waitFor();
        check(rc == 0, "kill -" + sig + " " + pid + " failed");
    }
}

// Kafka's own clients and tools for the tests, driven from Python (logfs/testing/kafka.py): one JVM per test
// session answers commands, one JSON object a line on stdin, one JSON reply a line on stdout.
//
//   {"cmd": "create_topics", "bootstrap": "127.0.0.1:9092",
//    "topics": [{"name": "t", "partitions": 1, "replication_factor": 1, "configs": {"cleanup.policy": "compact"}}]}
//   {"cmd": "produce", "bootstrap": ..., "props": {"enable.idempotence": "true", "transactional.id": "tx",
//    "compression.type": "zstd", ...},
//    "records": [{"txn": "begin"}, {"topic": "t", "partition": 0, "key": B64|null, "value": B64|null,
//                 "headers": [["h", B64|null]], "timestamp": 1700000000000}, {"txn": "commit"|"abort"}, ...]}
//     -> {"sent": [{"partition": 0, "offset": 5, "timestamp": ...}, ...]}  (records in order, markers left out)
//   {"cmd": "consume", "bootstrap": ..., "topic": "t", "partition": 0, "offset": 0,
//    "isolation": "read_committed", "timeout_ms": 30000, "leader_epoch": null, "props": {...}}
//     -> {"end": N, "records": [{"offset", "timestamp", "timestamp_type", "key", "value", "headers",
//                                "leader_epoch"}]}   from offset to the end offset the isolation level sees
//     With "leader_epoch", the position is an offset with its epoch, as a committed offset restores it
//     (seek(tp, OffsetAndMetadata)): the consumer validates it with OffsetsForLeaderEpoch before it fetches. "props"
//     are consumer settings ("auto.offset.reset": "none" makes a truncation it detects an error).
//   {"cmd": "list_offsets", "bootstrap": ..., "topic": "t", "partition": 0, "timestamps": [t1, ...],
//    "isolation": "read_committed"}
//     -> {"earliest": o, "latest": o, "max_timestamp": {"offset", "timestamp"},
//         "by_timestamp": [{"offset", "timestamp"} | null, ...]}   (Kafka's ListOffsets)
//   {"cmd": "run_main", "class": "kafka.tools.DumpLogSegments", "args": ["--files", "a.log,b.index", ...]}
//     -> {"stdout": "...", "stderr": "...", "status": 0, "error": null | "the exception the tool died of"}
//        A tool's main (DumpLogSegments, StorageTool) run in this JVM: no JVM start per run. Its System.out/err
//        (and Scala's Console) are captured; Exit.exit(status) ends the tool, not the JVM.
//   {"cmd": "ping"} -> {}
//
// Also:
//   "produce" with several producers taking turns: "producers": {"other": {"transactional.id": "tx2", ...}} (each
//     one's settings over "props"), and "producer": "other" on a record or txn entry (none: the producer of "props"
//     alone). When an entry names another producer than the entry before it, that one is flushed first: records of
//     producers taking turns land in the log in the order given (a transaction's records among another's).
//   "produce" with "session": "s": its producers outlive the command (kept by session and name; a later "produce"
//     of that session uses them), so a transaction begun in one command may stay open and end in a later one;
//     "end_session": true closes them after this command.
//   {"cmd": "consume_partitions", "bootstrap": ..., "partitions": [["t", 0], ["u", 2], ...], "isolation": ...,
//    "timeout_ms": ...}
//     -> {"by_partition": [{"topic", "partition", "end", "records": [...]}, ...]}   "consume" of each partition from
//        its log start, by one consumer, in the order given
//   {"cmd": "commit_offsets", "bootstrap": ..., "group": "g", "offsets": [["t", 0, 12], ...]} -> {}
//   {"cmd": "alter_log_dirs", "bootstrap": ..., "moves": [["t", 0, 1, "/path/of/a/log/dir"], ...]} -> {}
//     the admin client's AlterReplicaLogDirs: (topic, partition, broker id) -> the log directory it moves to
//     the admin client's AlterConsumerGroupOffsets (records in __consumer_offsets)
//
// Bytes (keys, values, header values) are base64, null stays null. Every reply has "ok": true, or "ok": false and
// "error" (the exception's stack trace). Logging goes to the file of -Dlogfs.log.file (log4j2.properties), never
// to stdout or stderr.

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.io.PrintWriter;
import java.io.StringWriter;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.RetriableException;
import org.apache.kafka.common.TopicPartitionReplica;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.Exit;

public final class KafkaClient {
    private static final ObjectMapper JSON = new ObjectMapper();
    private static final Base64.Encoder B64 = Base64.getEncoder();
    private static final Base64.Decoder UNB64 = Base64.getDecoder();

    /** System.out and System.err of this JVM: the client's own stderr, or a dump's buffer while one runs. */
    private static final class Switch extends OutputStream {
        volatile OutputStream target;

        Switch(OutputStream target) { this.target = target; }

        @Override public void write(int b) throws IOException { target.write(b); }

        @Override public void write(byte[] b, int off, int len) throws IOException { target.write(b, off, len); }

        @Override public void flush() throws IOException { target.flush(); }
    }

    /** Kafka's tools call Exit.exit (System.exit) on bad arguments: a dump must not end this JVM. */
    private static final class ToolExit extends RuntimeException {
        final int status;

        ToolExit(int status, String message) {
            super("exit " + status + (message == null ? "" : ": " + message));
            this.status = status;
        }
    }

    private static Switch outSwitch;
    private static Switch errSwitch;
    private static final Map<String, Admin> ADMINS = new HashMap<>();
    private static final Map<String, Map<String, KafkaProducer<byte[], byte[]>>> SESSIONS = new HashMap<>();

    public static void main(String[] args) throws Exception {
        PrintStream replies = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);
        PrintStream stderr = new PrintStream(new FileOutputStream(FileDescriptor.err), true, StandardCharsets.UTF_8);
        // Before anything reads System.out (Scala's Console keeps the first one it sees).
        outSwitch = new Switch(stderr);
        errSwitch = new Switch(stderr);
        System.setOut(new PrintStream(outSwitch, true, StandardCharsets.UTF_8));
        System.setErr(new PrintStream(errSwitch, true, StandardCharsets.UTF_8));
        Exit.setExitProcedure((status, message) -> { throw new ToolExit(status, message); });

        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try {
            for (String line; (line = in.readLine()) != null; ) {
                if (line.isBlank()) continue;
                ObjectNode reply;
                try {
                    reply = handle(JSON.readTree(line));
                    reply.put("ok", true);
                } catch (Throwable t) {
                    reply = JSON.createObjectNode();
                    reply.put("ok", false);
                    reply.put("error", stackTrace(t));
                }
                replies.println(JSON.writeValueAsString(reply));
            }
        } finally {
            for (Admin admin : ADMINS.values()) admin.close(Duration.ofSeconds(5));
        }
    }

    private static ObjectNode handle(JsonNode cmd) throws Exception {
        String name = cmd.path("cmd").asText();
        switch (name) {
            case "ping": return JSON.createObjectNode();
            case "create_topics": return createTopics(cmd);
            case "produce": return produce(cmd);
            case "consume": return consume(cmd);
            case "list_offsets": return listOffsets(cmd);
            case "consume_partitions": return consumePartitions(cmd);
            case "commit_offsets": return commitOffsets(cmd);
            case "alter_log_dirs": return alterLogDirs(cmd);
            case "run_main": return runMain(cmd);
            default: throw new IllegalArgumentException("unknown command: " + name);
        }
    }

    // -- helpers ----------------------------------------------------------------------------------------------
    private static String stackTrace(Throwable t) {
        StringWriter w = new StringWriter();
        t.printStackTrace(new PrintWriter(w));
        return w.toString();
    }

    private static byte[] bytes(JsonNode node) {
        return node == null || node.isNull() || node.isMissingNode() ? null : UNB64.decode(node.asText());
    }

    private static void putBytes(ObjectNode node, String field, byte[] value) {
        if (value == null) node.putNull(field); else node.put(field, B64.encodeToString(value));
    }

    private static Properties props(JsonNode cmd) {
        Properties props = new Properties();
        props.put("bootstrap.servers", cmd.path("bootstrap").asText());
        for (Map.Entry<String, JsonNode> e : cmd.path("props").properties()) props.put(e.getKey(), e.getValue().asText());
        return props;
    }

    private static Admin admin(JsonNode cmd) {
        return ADMINS.computeIfAbsent(cmd.path("bootstrap").asText(), bootstrap -> Admin.create(props(cmd)));
    }

    private static IsolationLevel isolation(JsonNode cmd) {
        return IsolationLevel.valueOf(cmd.path("isolation").asText("read_committed").toUpperCase());
    }

    // -- commands ---------------------------------------------------------------------------------------------
    private static ObjectNode createTopics(JsonNode cmd) throws Exception {
        List<NewTopic> topics = new ArrayList<>();
        for (JsonNode t : cmd.path("topics")) {
            Map<String, String> configs = new HashMap<>();
            for (Map.Entry<String, JsonNode> e : t.path("configs").properties()) configs.put(e.getKey(), e.getValue().asText());
            topics.add(new NewTopic(t.path("name").asText(), t.path("partitions").asInt(1),
                                    (short) t.path("replication_factor").asInt(1)).configs(configs));
        }
        ObjectNode reply = JSON.createObjectNode();
        ObjectNode ids = reply.putObject("topic_ids");
        Admin admin = admin(cmd);
        var result = admin.createTopics(topics);
        result.all().get();
        for (NewTopic t : topics) ids.put(t.name(), result.topicId(t.name()).get().toString());
        awaitLeaders(admin, topics);
        return reply;
    }

    // Until every partition's leader answers ListOffsets (at most 60 s): CreateTopics returns once the controller
    // made the topics, before the brokers lead them. A producer sending meanwhile gets NOT_LEADER_OR_FOLLOWER, and
    // an idempotent one then retried its first batch for ever as OUT_OF_ORDER_SEQUENCE_NUMBER on a loaded machine
    // (Kafka 4.2.2: the broker had appended it), so a test's writes never ended.
    private static void awaitLeaders(Admin admin, List<NewTopic> topics) throws Exception {
        Map<TopicPartition, OffsetSpec> all = new HashMap<>();
        for (NewTopic t : topics)
            for (int p = 0; p < t.numPartitions(); p++) all.put(new TopicPartition(t.name(), p), OffsetSpec.latest());
        long deadline = System.nanoTime() + 60_000_000_000L;
        while (true) {
            try {
                admin.listOffsets(all).all().get();
                return;
            } catch (ExecutionException e) {
                if (!(e.getCause() instanceof RetriableException) || System.nanoTime() > deadline) throw e;
                Thread.sleep(50);
            }
        }
    }

    private static ObjectNode produce(JsonNode cmd) throws Exception {
        String session = cmd.path("session").asText("");
        boolean keep = !session.isEmpty() && !cmd.path("end_session").asBoolean(false);
        Map<String, KafkaProducer<byte[], byte[]>> producers =
            session.isEmpty() ? new HashMap<>() : SESSIONS.computeIfAbsent(session, s -> new HashMap<>());
        List<Future<RecordMetadata>> futures = new ArrayList<>();
        try {
            String previous = null;
            for (JsonNode r : cmd.path("records")) {
                String name = r.path("producer").asText("");
                KafkaProducer<byte[], byte[]> producer = producers.get(name);
                if (producer == null) {
                    Properties props = props(cmd);
                    if (!name.isEmpty()) {
                        JsonNode own = cmd.path("producers").path(name);
                        if (own.isMissingNode()) throw new IllegalArgumentException("unknown producer: " + name);
                        for (Map.Entry<String, JsonNode> e : own.properties()) props.put(e.getKey(), e.getValue().asText());
                    }
                    props.put("key.serializer", ByteArraySerializer.class.getName());
                    props.put("value.serializer", ByteArraySerializer.class.getName());
                    producer = new KafkaProducer<>(props);
                    producers.put(name, producer);
                    if (props.containsKey("transactional.id")) producer.initTransactions();
                }
                if (previous != null && !previous.equals(name)) producers.get(previous).flush();
                previous = name;
                String txn = r.path("txn").asText("");
                if (txn.equals("begin")) producer.beginTransaction();
                else if (txn.equals("commit")) producer.commitTransaction();
                else if (txn.equals("abort")) { producer.flush(); producer.abortTransaction(); }
                else if (!txn.isEmpty()) throw new IllegalArgumentException("unknown txn marker: " + txn);
                else {
                    List<Header> headers = new ArrayList<>();
                    for (JsonNode h : r.path("headers")) headers.add(new RecordHeader(h.get(0).asText(), bytes(h.get(1))));
                    Integer partition = r.hasNonNull("partition") ? r.get("partition").asInt() : null;
                    Long timestamp = r.hasNonNull("timestamp") ? r.get("timestamp").asLong() : null;
                    futures.add(producer.send(new ProducerRecord<>(r.path("topic").asText(), partition, timestamp,
                                                                   bytes(r.get("key")), bytes(r.get("value")), headers)));
                }
            }
            for (KafkaProducer<byte[], byte[]> producer : producers.values()) producer.flush();
        } finally {
            if (!keep) {
                for (KafkaProducer<byte[], byte[]> producer : producers.values()) producer.close();
                if (!session.isEmpty()) SESSIONS.remove(session);
            }
        }
        ObjectNode reply = JSON.createObjectNode();
        ArrayNode sent = reply.putArray("sent");
        for (Future<RecordMetadata> f : futures) {
            RecordMetadata m = f.get();
            sent.addObject().put("partition", m.partition()).put("offset", m.offset()).put("timestamp", m.timestamp());
        }
        return reply;
    }

    private static ObjectNode consume(JsonNode cmd) throws Exception {
        Properties props = props(cmd);
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        props.put("isolation.level", isolation(cmd).toString());
        props.put("enable.auto.commit", "false");
        props.putIfAbsent("auto.offset.reset", "earliest");
        props.putIfAbsent("fetch.max.wait.ms", FETCH_MAX_WAIT_MS);
        TopicPartition tp = new TopicPartition(cmd.path("topic").asText(), cmd.path("partition").asInt(0));
        long deadline = System.currentTimeMillis() + cmd.path("timeout_ms").asLong(30000);
        ObjectNode reply = JSON.createObjectNode();
        ArrayNode out = reply.putArray("records");
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.assign(List.of(tp));
            if (cmd.hasNonNull("offset") && cmd.hasNonNull("leader_epoch"))
                consumer.seek(tp, new OffsetAndMetadata(cmd.get("offset").asLong(),
                                                        Optional.of(cmd.get("leader_epoch").asInt()), ""));
            else if (cmd.hasNonNull("offset")) consumer.seek(tp, cmd.get("offset").asLong());
            else consumer.seekToBeginning(List.of(tp));
            long end = consumer.endOffsets(List.of(tp)).get(tp);  // the last stable offset under read_committed
            reply.put("end", end);
            while (consumer.position(tp) < end) {
                if (System.currentTimeMillis() > deadline)
                    throw new IllegalStateException("consumed up to " + consumer.position(tp) + " of " + end + " in time");
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    if (r.offset() >= end) continue;
                    ObjectNode o = out.addObject();
                    o.put("offset", r.offset()).put("timestamp", r.timestamp())
                        .put("timestamp_type", r.timestampType().toString());
                    putBytes(o, "key", r.key());
                    putBytes(o, "value", r.value());
                    ArrayNode headers = o.putArray("headers");
                    for (Header h : r.headers()) {
                        ArrayNode pair = headers.addArray().add(h.key());
                        if (h.value() == null) pair.addNull(); else pair.add(B64.encodeToString(h.value()));
                    }
                    if (r.leaderEpoch().isPresent()) o.put("leader_epoch", r.leaderEpoch().get());
                }
            }
        }
        return reply;
    }

    // A consume reads up to ends known in advance: a fetch that waits for more data (500 ms by default, each time a
    // partition is at its end) only delays. 20 ms made a consume of one partition 0.13 s instead of 0.9 s.
    private static final String FETCH_MAX_WAIT_MS = "20";

    private static ObjectNode consumePartitions(JsonNode cmd) throws Exception {
        Properties props = props(cmd);
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        props.put("isolation.level", isolation(cmd).toString());
        props.put("enable.auto.commit", "false");
        props.putIfAbsent("auto.offset.reset", "earliest");
        props.putIfAbsent("fetch.max.wait.ms", FETCH_MAX_WAIT_MS);
        List<TopicPartition> tps = new ArrayList<>();
        for (JsonNode tp : cmd.path("partitions")) tps.add(new TopicPartition(tp.get(0).asText(), tp.get(1).asInt()));
        long deadline = System.currentTimeMillis() + cmd.path("timeout_ms").asLong(60000);
        ObjectNode reply = JSON.createObjectNode();
        ArrayNode all = reply.putArray("by_partition");
        Map<TopicPartition, ArrayNode> outs = new HashMap<>();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.assign(tps);
            consumer.seekToBeginning(tps);
            Map<TopicPartition, Long> ends = consumer.endOffsets(tps);  // the last stable offsets under read_committed
            for (TopicPartition tp : tps) {
                ObjectNode one = all.addObject().put("topic", tp.topic()).put("partition", tp.partition());
                outs.put(tp, one.put("end", ends.get(tp)).putArray("records"));
            }
            while (true) {
                TopicPartition behind = null;
                for (TopicPartition tp : tps) if (consumer.position(tp) < ends.get(tp)) { behind = tp; break; }
                if (behind == null) break;
                if (System.currentTimeMillis() > deadline)
                    throw new IllegalStateException(behind + ": consumed up to " + consumer.position(behind) + " of "
                                                    + ends.get(behind) + " in time");
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                    if (r.offset() < ends.get(tp)) recordJson(outs.get(tp).addObject(), r);
                }
            }
        }
        return reply;
    }

    private static void recordJson(ObjectNode o, ConsumerRecord<byte[], byte[]> r) {
        o.put("offset", r.offset()).put("timestamp", r.timestamp()).put("timestamp_type", r.timestampType().toString());
        putBytes(o, "key", r.key());
        putBytes(o, "value", r.value());
        ArrayNode headers = o.putArray("headers");
        for (Header h : r.headers()) {
            ArrayNode pair = headers.addArray().add(h.key());
            if (h.value() == null) pair.addNull(); else pair.add(B64.encodeToString(h.value()));
        }
        if (r.leaderEpoch().isPresent()) o.put("leader_epoch", r.leaderEpoch().get());
    }

    private static ObjectNode commitOffsets(JsonNode cmd) throws Exception {
        Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
        for (JsonNode o : cmd.path("offsets"))
            offsets.put(new TopicPartition(o.get(0).asText(), o.get(1).asInt()), new OffsetAndMetadata(o.get(2).asLong()));
        admin(cmd).alterConsumerGroupOffsets(cmd.path("group").asText(), offsets).all().get();
        return JSON.createObjectNode();
    }

    private static ObjectNode alterLogDirs(JsonNode cmd) throws Exception {
        Map<TopicPartitionReplica, String> moves = new HashMap<>();
        for (JsonNode m : cmd.path("moves"))
            moves.put(new TopicPartitionReplica(m.get(0).asText(), m.get(1).asInt(), m.get(2).asInt()), m.get(3).asText());
        admin(cmd).alterReplicaLogDirs(moves).all().get();
        return JSON.createObjectNode();
    }

    private static ObjectNode listOffsets(JsonNode cmd) throws Exception {
        TopicPartition tp = new TopicPartition(cmd.path("topic").asText(), cmd.path("partition").asInt(0));
        ListOffsetsOptions options = new ListOffsetsOptions(isolation(cmd));
        Admin admin = admin(cmd);
        ObjectNode reply = JSON.createObjectNode();
        reply.put("earliest", one(admin, tp, OffsetSpec.earliest(), options).offset());
        reply.put("latest", one(admin, tp, OffsetSpec.latest(), options).offset());
        ListOffsetsResult.ListOffsetsResultInfo max = one(admin, tp, OffsetSpec.maxTimestamp(), options);
        reply.putObject("max_timestamp").put("offset", max.offset()).put("timestamp", max.timestamp());
        ArrayNode found = reply.putArray("by_timestamp");
        for (JsonNode ts : cmd.path("timestamps")) {
            ListOffsetsResult.ListOffsetsResultInfo info = one(admin, tp, OffsetSpec.forTimestamp(ts.asLong()), options);
            if (info.offset() < 0) found.addNull();  // no record at or after the timestamp
            else found.addObject().put("offset", info.offset()).put("timestamp", info.timestamp());
        }
        return reply;
    }

    private static ListOffsetsResult.ListOffsetsResultInfo one(Admin admin, TopicPartition tp, OffsetSpec spec,
                                                               ListOffsetsOptions options) throws Exception {
        return admin.listOffsets(Map.of(tp, spec), options).partitionResult(tp).get();
    }

    private static ObjectNode runMain(JsonNode cmd) throws Exception {
        List<String> args = new ArrayList<>();
        for (JsonNode a : cmd.path("args")) args.add(a.asText());
        java.lang.reflect.Method main = Class.forName(cmd.path("class").asText()).getMethod("main", String[].class);
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        ByteArrayOutputStream err = new ByteArrayOutputStream();
        OutputStream oldOut = outSwitch.target, oldErr = errSwitch.target;
        String error = null;
        int status = 0;
        System.out.flush();
        System.err.flush();
        outSwitch.target = out;
        errSwitch.target = err;
        try {
            main.invoke(null, (Object) args.toArray(new String[0]));
        } catch (java.lang.reflect.InvocationTargetException e) {
            Throwable t = e.getCause();
            if (t instanceof ToolExit) status = ((ToolExit) t).status;
            else { status = 1; error = stackTrace(t); }
        } finally {
            System.out.flush();
            System.err.flush();
            scala.Console.out().flush();
            outSwitch.target = oldOut;
            errSwitch.target = oldErr;
        }
        ObjectNode reply = JSON.createObjectNode();
        reply.put("stdout", out.toString(StandardCharsets.UTF_8));
        reply.put("stderr", err.toString(StandardCharsets.UTF_8));
        reply.put("status", status);
        if (error == null) reply.putNull("error"); else reply.put("error", error);
        return reply;
    }
}

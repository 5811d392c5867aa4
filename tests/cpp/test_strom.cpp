// The C++ conformance essentials of strom.hpp, against an embedded server
// in a fresh temporary directory: order, selection (built-in and lambda),
// a broker lambda, acks per consumer name, end of stream with several
// producer threads, process() with an exception, lent data, and errors.
// Exits non-zero, naming the failed check, when anything is wrong.
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "strom.hpp"

namespace {

int failures = 0;

#define CHECK(cond, what)                                                              \
  do {                                                                                 \
    if (!(cond)) {                                                                     \
      std::cerr << "FAIL " << __FILE__ << ":" << __LINE__ << ": " << what << "\n"; \
      failures++;                                                                      \
      return;                                                                          \
    }                                                                                  \
  } while (0)

strom::topic make_topic(strom::driver& d, const std::string& name, uint32_t parts = 1,
                        std::optional<std::string> selector = std::nullopt) {
  strom::topic_spec spec;
  spec.name = name;
  spec.partitions = parts;
  spec.partition_type = "memory";
  spec.selector = selector;
  return d.create_topic(spec);
}

void order_and_data(strom::driver& d) {
  auto t = make_topic(d, "order");
  auto p = t.make_producer();
  std::vector<strom::future> futs;
  for (int i = 0; i < 50; i++) {
    std::string data = "payload-" + std::to_string(i);
    futs.push_back(p.push("{\"seq\":" + std::to_string(i) + "}", data));
  }
  p.close();
  uint64_t last = 0;
  for (size_t i = 0; i < futs.size(); i++) {
    auto id = futs[i].wait();
    CHECK(i == 0 || id.offset > last, "offsets not increasing at " << i);
    CHECK(futs[i].ready(), "a waited future is not ready");
    last = id.offset;
  }
  auto c = t.make_consumer("reader");
  int i = 0;
  while (auto e = c.pull(std::chrono::seconds(10))) {
    CHECK(e->metadata() == "{\"seq\":" + std::to_string(i) + "}", "metadata " << e->metadata());
    CHECK(e->data().str() == "payload-" + std::to_string(i), "data of event " << i);
    i++;
  }
  CHECK(i == 50, "read " << i << " events before the end of the stream");
}

void selection_and_broker(strom::driver& d) {
  auto t = make_topic(d, "select");
  auto p = t.make_producer();
  std::vector<uint32_t> values(256);
  for (uint32_t i = 0; i < values.size(); i++) values[i] = i;
  for (int k = 0; k < 6; k++)
    p.push(k % 2 ? "{\"kind\":\"signal\"}" : "{\"kind\":\"noise\"}", strom::bytes_view(values));
  p.close();

  strom::consumer_options o;
  o.selector = [](const strom::event_info& e) {
    return strom::selection::strided(0, 4, 8, e.data_size / 8);  // every other value
  };
  auto c = t.make_consumer("strided", o);
  int n = 0;
  while (auto e = c.pull(std::chrono::seconds(10))) {
    auto v = e->data();
    CHECK(v.size() == 512, "strided selection fetched " << v.size() << " bytes");
    for (size_t j = 0; j < 128; j++) CHECK(v.as<uint32_t>()[j] == 2 * j, "value " << j);
    n++;
  }
  CHECK(n == 6, "strided consumer read " << n);

  std::atomic<int> released{0};
  strom::consumer_options b;
  b.select = "kind == signal";
  b.broker = [&released](const strom::event_info&, uint64_t len) {
    auto* mem = new std::vector<char>(len);
    size_t half = len / 2;
    return std::vector<strom::buffer>{
        {mem->data(), half, nullptr},
        {mem->data() + half, len - half, [mem, &released] { delete mem; released++; }}};
  };
  auto cb = t.make_consumer("brokered", b);
  int signals = 0;
  while (auto e = cb.pull(std::chrono::seconds(10))) {
    bool signal = e->metadata().find("signal") != std::string_view::npos;
    auto bytes = e->copy_data();
    CHECK(bytes.size() == (signal ? 1024u : 0u), "fetched " << bytes.size());
    if (signal) {
      CHECK(std::memcmp(bytes.data(), values.data(), 1024) == 0, "brokered bytes differ");
      signals++;
    }
  }
  CHECK(signals == 3, "saw " << signals << " signals");
  CHECK(released == 3, released << " brokered buffers released, not 3");
}

void acks_resume(strom::driver& d) {
  auto t = make_topic(d, "acks");
  auto p = t.make_producer();
  for (int i = 0; i < 10; i++) p.push("{}");
  p.flush();
  {
    auto c = t.make_consumer("acker");
    for (int i = 0; i < 4; i++) {
      auto e = c.pull(std::chrono::seconds(10));
      if (i == 3) e->ack_sync(std::chrono::seconds(10));
    }
  }
  auto c = t.make_consumer("acker");
  CHECK(c.pull(std::chrono::seconds(10))->offset() == 4, "did not resume after the ack");
  c.seek(strom::start_pos::beginning());
  CHECK(c.pull(std::chrono::seconds(10))->offset() == 0, "seek to the beginning");
  p.close();
}

void end_of_stream_and_process(strom::driver& d) {
  auto t = make_topic(d, "eos", 2, std::string("hash:producer"));
  std::vector<strom::producer> ps;
  for (int k = 0; k < 3; k++) ps.push_back(t.make_producer());
  std::vector<std::thread> threads;
  for (int k = 0; k < 3; k++)
    threads.emplace_back([&ps, k] {
      for (int i = 0; i < 100; i++)
        ps[k].push("{\"producer\":" + std::to_string(k) + ",\"seq\":" + std::to_string(i) + "}");
      ps[k].close();
    });
  auto c = t.make_consumer("processor");
  int started = 0, ended = 0, events = 0;
  std::map<int, int> last{{0, -1}, {1, -1}, {2, -1}};
  bool ordered = true;
  c.process([&] { started++; },
            [&](strom::event& e) {
              int producer = -1, seq = -1;
              std::string m(e.metadata());
              sscanf(m.c_str(), "{\"producer\":%d,\"seq\":%d}", &producer, &seq);
              ordered = ordered && seq == last[producer] + 1;
              last[producer] = seq;
              events++;
              e.ack();
            },
            [&] { ended++; });
  for (auto& th : threads) th.join();
  CHECK(started == 1 && ended == 1, "on_start " << started << ", on_end " << ended);
  CHECK(events == 300, "processed " << events);
  CHECK(ordered, "events out of producer order");

  // An exception in a callback stops processing and comes back out.
  auto t2 = make_topic(d, "throws");
  auto p = t2.make_producer();
  p.push("{}");
  p.close();
  auto c2 = t2.make_consumer("thrower");
  try {
    c2.process([] {}, [](strom::event&) { throw std::logic_error("from the callback"); }, [] {});
    CHECK(false, "process() did not rethrow");
  } catch (const std::logic_error& e) {
    CHECK(std::string(e.what()) == "from the callback", "rethrew " << e.what());
  }
}

void lent_and_errors(strom::driver& d) {
  auto t = make_topic(d, "lent");
  auto p = t.make_producer();
  auto owned = std::make_shared<std::vector<double>>(1000, 2.5);
  std::weak_ptr<std::vector<double>> watch = owned;
  p.push_lent("{}", strom::bytes_view(*owned), owned, 0).wait();
  owned.reset();
  p.close();
  for (int i = 0; i < 200 && !watch.expired(); i++) usleep(10000);
  CHECK(watch.expired(), "lent data was not released");
  auto c = t.make_consumer("lent");
  auto e = c.pull(std::chrono::seconds(10));
  CHECK(e && e->data().size() == 8000 && e->data().as<double>()[999] == 2.5, "lent event data");

  try {
    d.open_topic("missing");
    CHECK(false, "opening a missing topic did not throw");
  } catch (const strom::error& err) {
    CHECK(err.code() == STROM_ERR_TOPIC_NOT_FOUND, "code " << err.code());
    CHECK(std::string(err.what()).find("missing") != std::string::npos, err.what());
  }
  try {
    auto c2 = make_topic(d, "timeout").make_consumer("waiter");
    c2.pull(std::chrono::milliseconds(50));
    CHECK(false, "an empty pull did not time out");
  } catch (const strom::error& err) {
    CHECK(err.code() == STROM_ERR_TIMEOUT, "timeout code " << err.code());
  }
}

}  // namespace

int main() {
  char dir[] = "/tmp/strom-cpp-test-XXXXXX";
  if (!mkdtemp(dir)) return 2;
  {
    auto d = strom::driver::embedded(dir);
    order_and_data(d);
    selection_and_broker(d);
    acks_resume(d);
    end_of_stream_and_process(d);
    lent_and_errors(d);
  }
  std::string rm = std::string("rm -rf ") + dir;
  if (system(rm.c_str()) != 0) std::cerr << "could not remove " << dir << "\n";
  if (failures) {
    std::cerr << failures << " check(s) failed\n";
    return 1;
  }
  std::cout << "strom.hpp C++ tests: all passed\n";
  return 0;
}

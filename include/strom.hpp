// strom.hpp: a header-only C++17 layer over the C API of Strom (strom.h).
//
// - RAII handles: strom::driver, topic, producer, future, consumer, event
//   own their C handle and free it; they move, they do not copy.
// - Errors are exceptions: strom::error carries the status code
//   (error::code()) and libstrom's message.
// - Data is passed as views (strom::bytes_view, like std::span<const
//   std::byte>), and selectors, brokers and process callbacks are lambdas.
//   An exception thrown by a selector or broker refuses the event (the
//   pull throws STROM_ERR_DATA_SELECTOR / _DATA_BROKER); one thrown by a
//   process callback stops processing and is rethrown by process().
//
// Link with libstrom: c++ -std=c++17 app.cpp $(pkg-config --cflags --libs strom)
// Guide: docs/c-api.md.
#ifndef STROM_HPP
#define STROM_HPP

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "strom.h"

namespace strom {

/// A failed call: the status code and libstrom's message.
class error : public std::runtime_error {
 public:
  error(strom_status code, const std::string& message)
      : std::runtime_error(std::string(strom_status_name(code)) + ": " + message), code_(code) {}
  strom_status code() const noexcept { return code_; }

 private:
  strom_status code_;
};

/// Throws strom::error for anything but STROM_OK.
inline void check(strom_status s) {
  if (s != STROM_OK) throw error(s, strom_last_error());
}

/// A read-only view of bytes (C++17 has no std::span).
class bytes_view {
 public:
  constexpr bytes_view() noexcept = default;
  bytes_view(const void* data, std::size_t size) noexcept
      : data_(static_cast<const std::byte*>(data)), size_(size) {}
  bytes_view(std::string_view s) noexcept : bytes_view(s.data(), s.size()) {}
  bytes_view(const std::string& s) noexcept : bytes_view(s.data(), s.size()) {}
  template <class T>
  bytes_view(const std::vector<T>& v) noexcept : bytes_view(v.data(), v.size() * sizeof(T)) {}
  const std::byte* data() const noexcept { return data_; }
  std::size_t size() const noexcept { return size_; }
  bool empty() const noexcept { return size_ == 0; }
  const std::byte* begin() const noexcept { return data_; }
  const std::byte* end() const noexcept { return data_ + size_; }
  std::byte operator[](std::size_t i) const noexcept { return data_[i]; }
  std::string_view str() const noexcept {
    return {reinterpret_cast<const char*>(data_), size_};
  }
  /// The bytes as an array of T (size() must be a multiple of sizeof(T)).
  template <class T>
  const T* as() const noexcept {
    return reinterpret_cast<const T*>(data_);
  }

 private:
  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// Which bytes of an event's data to fetch.
struct selection {
  strom_selection c{STROM_SELECT_ALL, 0, 0, 0, 0};
  static selection all() { return {}; }
  static selection none() { return {{STROM_SELECT_NONE, 0, 0, 0, 0}}; }
  static selection range(uint64_t offset, uint64_t len) {
    return {{STROM_SELECT_RANGE, offset, len, 0, 0}};
  }
  static selection strided(uint64_t offset, uint64_t block, uint64_t stride, uint64_t count) {
    return {{STROM_SELECT_STRIDED, offset, block, stride, count}};
  }
};

/// What a selector, a broker or the application knows of an event.
struct event_info {
  uint32_t partition;
  uint64_t offset;
  uint64_t timestamp_us;
  std::string_view metadata;
  uint64_t data_size;  // UINT64_MAX in brokers (they get the selected length)
  bytes_view descriptor;

  static event_info from(const strom_event_meta& m) {
    return {m.partition, m.offset, m.timestamp_us, {m.metadata, m.metadata_len},
            m.data_size, {m.descriptor, m.descriptor_len}};
  }
};

/// Where an acknowledged event was stored.
using event_id = strom_event_id;

namespace detail {
template <class T, void (*Free)(T*)>
struct deleter {
  void operator()(T* p) const noexcept { Free(p); }
};
template <class T, void (*Free)(T*)>
using handle = std::unique_ptr<T, deleter<T, Free>>;
inline const char* opt(const std::optional<std::string>& s) { return s ? s->c_str() : nullptr; }
inline const char* opt(const std::string& s) { return s.empty() ? nullptr : s.c_str(); }
}  // namespace detail

/// The outcome of one push.
class future {
 public:
  explicit future(strom_future* f) : h_(f) {}
  /// Waits until the event is acknowledged; throws if its batch failed.
  event_id wait() const {
    event_id id{};
    check(strom_future_wait(h_.get(), &id));
    return id;
  }
  /// Waits at most `timeout`; std::nullopt if not acknowledged by then.
  std::optional<event_id> wait_for(std::chrono::milliseconds timeout) const {
    event_id id{};
    strom_status s = strom_future_wait_timeout(h_.get(), timeout.count(), &id);
    if (s == STROM_ERR_TIMEOUT) return std::nullopt;
    check(s);
    return id;
  }
  /// True once the push has an outcome (never blocks).
  bool ready() const {
    int32_t done = 0;
    check(strom_future_test(h_.get(), &done));
    return done != 0;
  }

 private:
  detail::handle<strom_future, strom_future_free> h_;
};

/// A producer of one topic; thread-safe.
class producer {
 public:
  explicit producer(strom_producer* p) : h_(p) {}
  /// Pushes metadata (JSON text by default) and data made of `parts`, all
  /// copied before the call returns.
  future push(std::string_view metadata, std::initializer_list<bytes_view> parts) {
    std::vector<strom_iovec> iov;
    for (auto& p : parts) iov.push_back({p.data(), p.size()});
    strom_future* f = nullptr;
    check(strom_producer_push(h_.get(), metadata.data(), metadata.size(), iov.data(), iov.size(),
                              &f));
    return future(f);
  }
  future push(std::string_view metadata, bytes_view data = {}) {
    return push(metadata, {data});
  }
  /// Pushes without copying `data`: `keep` is held (and the bytes must stay
  /// unchanged) until libstrom is done with them, then destroyed on any thread.
  template <class Owner>
  future push_lent(std::string_view metadata, bytes_view data, Owner keep,
                   int64_t partition = -1) {
    strom_push push;
    check(strom_push_init(&push, metadata.data(), metadata.size()));
    strom_iovec iov{data.data(), data.size()};
    push.data = &iov;
    push.ndata = 1;
    push.partition = partition;
    push.release = [](void* user) { delete static_cast<Owner*>(user); };
    push.release_user = new Owner(std::move(keep));
    strom_future* f = nullptr;
    check(strom_producer_push_ex(h_.get(), &push, &f));
    return future(f);
  }
  void flush() { check(strom_producer_flush(h_.get())); }
  /// Ends this producer's part of the stream (after a flush).
  void close() { check(strom_producer_close(h_.get())); }
  uint64_t id() const { return strom_producer_id(h_.get()); }
  strom_producer* get() const noexcept { return h_.get(); }

 private:
  detail::handle<strom_producer, strom_producer_free> h_;
};

/// A consumed event: owns its data unless it is borrowed inside process().
class event {
 public:
  explicit event(strom_event* e, bool owned = true) : e_(e), owned_(owned) {}
  event(event&& o) noexcept : e_(std::exchange(o.e_, nullptr)), owned_(o.owned_) {}
  event& operator=(event&& o) noexcept {
    if (this != &o) {
      reset();
      e_ = std::exchange(o.e_, nullptr);
      owned_ = o.owned_;
    }
    return *this;
  }
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  ~event() { reset(); }

  event_info info() const {
    strom_event_meta m;
    check(strom_event_info(e_, &m));
    return event_info::from(m);
  }
  uint32_t partition() const { return info().partition; }
  uint64_t offset() const { return info().offset; }
  std::string_view metadata() const {
    std::size_t n = 0;
    const char* p = strom_event_metadata(e_, &n);
    return {p, n};
  }
  /// The fetched data when it is in one buffer (always without a broker).
  bytes_view data() const {
    std::size_t n = 0;
    const uint8_t* p = strom_event_data(e_, &n);
    return {p, n};
  }
  uint64_t fetched_len() const { return strom_event_fetched_len(e_); }
  /// The fetched data, copied out of every buffer in order.
  std::vector<std::byte> copy_data() const {
    std::vector<std::byte> out(static_cast<std::size_t>(fetched_len()));
    std::size_t n = 0;
    check(strom_event_copy_data(e_, out.data(), out.size(), &n));
    out.resize(n);
    return out;
  }
  /// Acks (persisted in the background); covers earlier events of the partition.
  void ack() const { check(strom_event_ack(e_)); }
  /// Acks and waits until the ack is persisted.
  void ack_sync(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) const {
    check(strom_event_ack_sync(e_, timeout.count()));
  }
  strom_event* get() const noexcept { return e_; }

 private:
  void reset() noexcept {
    if (e_ && owned_) strom_event_free(e_);
    e_ = nullptr;
  }
  strom_event* e_ = nullptr;
  bool owned_ = true;
};

/// A broker's destination buffer, and what to do when libstrom is done with it.
struct buffer {
  void* data;
  std::size_t size;
  std::function<void()> release;  // may be empty; called on any thread
};

/// Where a consumer starts.
struct start_pos {
  uint32_t kind = STROM_START_COMMITTED;
  uint64_t value = 0;
  static start_pos committed() { return {}; }
  static start_pos beginning() { return {STROM_START_BEGINNING, 0}; }
  static start_pos end() { return {STROM_START_END, 0}; }
  static start_pos offset(uint64_t o) { return {STROM_START_OFFSET, o}; }
  static start_pos timestamp_us(uint64_t t) { return {STROM_START_TIMESTAMP, t}; }
};

struct consumer_options {
  std::optional<std::vector<uint32_t>> partitions;  // all when empty
  uint32_t prefetch = 0;                            // 0: default
  uint64_t prefetch_bytes = 0;                      // 0: default
  start_pos start;
  /// A built-in selector expression (`strom consume --select` syntax).
  std::string select;
  /// A selector lambda (runs on libstrom's threads; must be thread-safe).
  std::function<selection(const event_info&)> selector;
  /// A broker lambda: buffers holding at least `len` bytes in total.
  std::function<std::vector<buffer>(const event_info&, uint64_t len)> broker;
  std::string group;       // join this consumer group
  std::string group_mode;  // "partitioned" (default) or "shared"
};

namespace detail {
/// The lambdas of one consumer, at a stable address for the C callbacks.
struct consumer_callbacks {
  std::function<selection(const event_info&)> selector;
  std::function<std::vector<buffer>(const event_info&, uint64_t)> broker;

  static strom_status select(void* user, const strom_event_meta* m, strom_selection* out) noexcept {
    try {
      *out = static_cast<consumer_callbacks*>(user)->selector(event_info::from(*m)).c;
      return STROM_OK;
    } catch (...) {
      return STROM_ERR_CALLBACK;
    }
  }
  static strom_status give(void* user, const strom_event_meta* m, const strom_selection*,
                           uint64_t len, strom_buffer* bufs, std::size_t max,
                           std::size_t* n) noexcept {
    try {
      auto given = static_cast<consumer_callbacks*>(user)->broker(event_info::from(*m), len);
      if (given.size() > max) return STROM_ERR_DATA_BROKER;
      for (std::size_t i = 0; i < given.size(); i++) {
        auto* release = given[i].release ? new std::function<void()>(std::move(given[i].release))
                                         : nullptr;
        bufs[i] = {given[i].data, given[i].size, release};
      }
      *n = given.size();
      return STROM_OK;
    } catch (...) {
      return STROM_ERR_CALLBACK;
    }
  }
  static void release(void*, const strom_buffer* b) noexcept {
    auto* f = static_cast<std::function<void()>*>(b->token);
    if (!f) return;
    try {
      (*f)();
    } catch (...) {
    }
    delete f;
  }
};
}  // namespace detail

/// A consumer; thread-safe (each event goes to one puller).
class consumer {
 public:
  consumer(strom_consumer* c, std::unique_ptr<detail::consumer_callbacks> cb)
      : cb_(std::move(cb)), h_(c) {}
  /// The next event, or std::nullopt at the end of the stream. Throws
  /// strom::error (code STROM_ERR_TIMEOUT) when `timeout` passes first.
  std::optional<event> pull(std::chrono::milliseconds timeout = std::chrono::milliseconds(-1)) {
    strom_event* e = nullptr;
    strom_status s = strom_consumer_pull(h_.get(), timeout.count(), &e);
    if (s == STROM_END_OF_STREAM) return std::nullopt;
    check(s);
    return event(e);
  }
  void seek(start_pos pos) { check(strom_consumer_seek(h_.get(), pos.kind, pos.value)); }
  /// on_start(), on_event(event&) for every event until the end of the
  /// stream, then on_end(), on this thread. An exception from a callback
  /// stops processing and is rethrown here.
  template <class Start, class OnEvent, class End>
  void process(Start on_start, OnEvent on_event, End on_end) {
    struct state {
      Start* start;
      OnEvent* each;
      End* end;
      std::exception_ptr failed;
    } st{&on_start, &on_event, &on_end, nullptr};
    strom_process_callbacks cb{
        [](void* u) {
          auto* s = static_cast<state*>(u);
          try {
            (*s->start)();
          } catch (...) {
            s->failed = std::current_exception();
          }
        },
        [](void* u, strom_event* e) -> strom_status {
          auto* s = static_cast<state*>(u);
          if (s->failed) return STROM_ERR_CALLBACK;
          try {
            event ev(e, false);
            (*s->each)(ev);
            return STROM_OK;
          } catch (...) {
            s->failed = std::current_exception();
            return STROM_ERR_CALLBACK;
          }
        },
        [](void* u) {
          auto* s = static_cast<state*>(u);
          try {
            (*s->end)();
          } catch (...) {
            s->failed = std::current_exception();
          }
        }};
    strom_status s = strom_consumer_process(h_.get(), &cb, &st);
    if (st.failed) std::rethrow_exception(st.failed);
    check(s);
  }
  strom_consumer* get() const noexcept { return h_.get(); }

 private:
  // Destroyed after the handle, which is the last user of the callbacks.
  std::unique_ptr<detail::consumer_callbacks> cb_;
  detail::handle<strom_consumer, strom_consumer_free> h_;
};

struct producer_options {
  uint32_t max_batches = 0;   // 0: default
  uint32_t batch_events = 0;  // 0: adaptive
  int64_t linger_ms = -1;     // -1: default
  int64_t lease_ms = 0;       // 0: server default, -1: no lease
};

/// A topic handle.
class topic {
 public:
  explicit topic(strom_topic* t) : h_(t) {}
  std::string name() const { return strom_topic_name(h_.get()); }
  uint32_t partitions() const { return strom_topic_partitions(h_.get()); }
  /// Ends the stream now, whatever producers are open.
  void complete() { check(strom_topic_complete(h_.get())); }

  producer make_producer(const producer_options& o = {}) {
    strom_producer_options c{o.max_batches, o.batch_events, o.linger_ms, o.lease_ms};
    strom_producer* p = nullptr;
    check(strom_producer_open(h_.get(), &c, &p));
    return producer(p);
  }

  consumer make_consumer(const std::string& name, const consumer_options& o = {}) {
    strom_consumer_options c;
    check(strom_consumer_options_init(&c));
    if (o.partitions) {
      c.partitions = o.partitions->data();
      c.npartitions = o.partitions->size();
    }
    c.prefetch = o.prefetch;
    c.prefetch_bytes = o.prefetch_bytes;
    c.start = o.start.kind;
    c.start_value = o.start.value;
    c.select = detail::opt(o.select);
    c.group = detail::opt(o.group);
    c.group_mode = detail::opt(o.group_mode);
    auto cb = std::make_unique<detail::consumer_callbacks>();
    if (o.selector) {
      cb->selector = o.selector;
      c.selector = &detail::consumer_callbacks::select;
      c.selector_user = cb.get();
    }
    if (o.broker) {
      cb->broker = o.broker;
      c.broker = &detail::consumer_callbacks::give;
      c.broker_release = &detail::consumer_callbacks::release;
      c.broker_user = cb.get();
    }
    strom_consumer* h = nullptr;
    check(strom_consumer_open(h_.get(), name.c_str(), &c, &h));
    return consumer(h, std::move(cb));
  }
  strom_topic* get() const noexcept { return h_.get(); }

 private:
  detail::handle<strom_topic, strom_topic_free> h_;
};

struct topic_spec {
  std::string name;
  uint32_t partitions = 1;
  std::optional<std::string> partition_type, durability, validator, schema, selector, serializer,
      overflow;
  uint64_t retention_bytes = 0, retention_ms = 0, segment_bytes = 0;
};

/// A connection to a Strom group, or a server inside this process.
class driver {
 public:
  explicit driver(strom_driver* d) : h_(d) {}
  /// Starts a server in this process with its data under `data_dir`.
  static driver embedded(const std::string& data_dir) {
    strom_driver* d = nullptr;
    check(strom_driver_embedded(data_dir.c_str(), &d));
    return driver(d);
  }
  /// Connects through a group file.
  static driver connect(const std::string& group_file) {
    strom_driver* d = nullptr;
    check(strom_driver_connect(group_file.c_str(), &d));
    return driver(d);
  }
  /// Connects to the registry master at `host:port`.
  static driver connect_addr(const std::string& addr) {
    strom_driver* d = nullptr;
    check(strom_driver_connect_addr(addr.c_str(), &d));
    return driver(d);
  }
  std::string master_addr() const { return strom_driver_master_addr(h_.get()); }

  topic create_topic(const topic_spec& s) {
    strom_topic_spec c;
    check(strom_topic_spec_init(&c, s.name.c_str(), s.partitions));
    c.partition_type = detail::opt(s.partition_type);
    c.durability = detail::opt(s.durability);
    c.validator = detail::opt(s.validator);
    c.schema = detail::opt(s.schema);
    c.selector = detail::opt(s.selector);
    c.serializer = detail::opt(s.serializer);
    c.overflow = detail::opt(s.overflow);
    c.retention_bytes = s.retention_bytes;
    c.retention_ms = s.retention_ms;
    c.segment_bytes = s.segment_bytes;
    strom_topic* t = nullptr;
    check(strom_topic_create(h_.get(), &c, &t));
    return topic(t);
  }
  topic open_topic(const std::string& name) {
    strom_topic* t = nullptr;
    check(strom_topic_open(h_.get(), name.c_str(), &t));
    return topic(t);
  }
  void delete_topic(const std::string& name) {
    check(strom_topic_delete(h_.get(), name.c_str()));
  }
  strom_driver* get() const noexcept { return h_.get(); }

 private:
  detail::handle<strom_driver, strom_driver_free> h_;
};

}  // namespace strom

#endif  // STROM_HPP

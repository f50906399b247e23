// TensorBoard event files (see include/medfast/profile/events.hpp): CRC-32C, the protobuf
// wire format for the three messages medfast writes, TFRecord framing, and the writer.
#include "medfast/profile/events.hpp"

#include <array>
#include <chrono>
#include <cmath>
#include <cstring>

#include "medfast/core/error.hpp"
#include "medfast/os/process.hpp"

namespace medfast::profile {

namespace {

/// The reflected CRC-32C table (polynomial 0x1EDC6F41, reversed 0x82F63B78).
const std::array<std::uint32_t, 256>& crc_table() {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

// Protocol buffer wire format (developers.google.com/protocol-buffers/docs/encoding):
// a key is (field << 3) | wire type; 0 varint, 1 64-bit, 2 length-delimited, 5 32-bit.
void varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void key(std::string& out, int field, int wire_type) {
  varint(out, static_cast<std::uint64_t>(field << 3 | wire_type));
}

template <typename T>
void little_endian(std::string& out, T bits) {
  for (std::size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

void double_field(std::string& out, int field, double v) {
  std::uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  key(out, field, 1);
  little_endian(out, bits);
}

void float_field(std::string& out, int field, float v) {
  std::uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  key(out, field, 5);
  little_endian(out, bits);
}

void bytes_field(std::string& out, int field, const std::string& bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}

void int64_field(std::string& out, int field, std::int64_t v) {
  key(out, field, 0);
  varint(out, static_cast<std::uint64_t>(v));  // int64: two's complement, 10 bytes when negative
}

}  // namespace

std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc) {
  const auto& t = crc_table();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (std::size_t i = 0; i < size; ++i) crc = t[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return ~crc;
}

std::uint32_t masked_crc32c(const void* data, std::size_t size) {
  const std::uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string encode_scalar_event(const std::string& tag, float value, std::int64_t step, double wall_time) {
  std::string v;  // Summary.Value
  bytes_field(v, 1, tag);
  float_field(v, 2, value);
  std::string summary;
  bytes_field(summary, 1, v);
  std::string event;
  double_field(event, 1, wall_time);
  int64_field(event, 2, step);
  bytes_field(event, 5, summary);
  return event;
}

std::string encode_version_event(double wall_time) {
  std::string event;
  double_field(event, 1, wall_time);
  bytes_field(event, 3, "brain.Event:2");
  return event;
}

std::string tfrecord(const std::string& payload) {
  std::string out;
  std::string length;
  little_endian(length, static_cast<std::uint64_t>(payload.size()));
  out += length;
  little_endian(out, masked_crc32c(length.data(), length.size()));
  out += payload;
  little_endian(out, masked_crc32c(payload.data(), payload.size()));
  return out;
}

bool is_event_file(const std::string& name) {
  return name.rfind("events.out.tfevents.", 0) == 0;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

EventWriter::EventWriter(const std::string& dir) {
  const double now = unix_seconds();
  std::string host = os::machine_info().hostname;
  for (char& c : host) {
    if (c == '/' || c == ' ') c = '_';
  }
  // A second writer in the same second (a resume right after a stop) takes the next
  // second's name: TensorBoard reads a folder's files in name order.
  auto seconds = static_cast<long long>(std::floor(now));
  std::string path;
  for (;; ++seconds) {
    path = str(dir, "/events.out.tfevents.", seconds, ".", host.empty() ? "localhost" : host, ".", os::process_id(),
               ".medfast");
    if (!os::exists(path)) break;
  }
  file_ = os::File::open(path, os::File::Mode::create_new);
  pending_ = tfrecord(encode_version_event(now));
  flush();
}

void EventWriter::scalar(const std::string& tag, double value, std::int64_t step, double wall_time) {
  pending_ += tfrecord(encode_scalar_event(tag, static_cast<float>(value), step, wall_time));
}

void EventWriter::flush() {
  if (pending_.empty()) return;
  file_.write_at(pending_.data(), pending_.size(), size_);
  file_.sync();
  size_ += pending_.size();
  pending_.clear();
}

}  // namespace medfast::profile

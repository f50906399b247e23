#pragma once
/// \file
/// TensorBoard event files, written natively: TFRecord framing (length, masked CRC-32C of
/// the length, payload, masked CRC-32C of the payload) around hand-encoded `Event` protocol
/// buffers (tensorflow/core/util/event.proto: wall_time = 1 (double), step = 2 (int64),
/// file_version = 3 (string), summary = 5; Summary.value = 1; Summary.Value.tag = 1,
/// simple_value = 2 (float)). No TensorFlow, no libprotobuf. TensorBoard reads every
/// `events.out.tfevents.*` file of a folder and merges them, so a resumed run starts a new
/// file whose steps continue where the last one stopped.

#include <cstdint>
#include <string>
#include <vector>

#include "medfast/os/file.hpp"

namespace medfast::profile {

/// CRC-32C (Castagnoli), as TFRecord uses it.
std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0);
/// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
std::uint32_t masked_crc32c(const void* data, std::size_t size);

/// One `Event` holding one scalar, encoded (exposed for tests).
std::string encode_scalar_event(const std::string& tag, float value, std::int64_t step, double wall_time);
/// The first event of every file: file_version "brain.Event:2".
std::string encode_version_event(double wall_time);
/// A payload framed as one TFRecord.
std::string tfrecord(const std::string& payload);

/// Whether `name` is an event file name (events.out.tfevents.*).
bool is_event_file(const std::string& name);

/// Scalars for one run folder. Records are kept in memory until flush(), which appends
/// them to the file and syncs it: a process that dies between flushes loses the scalars
/// since the last flush, never a record half written (TensorBoard stops reading a file
/// at a damaged record).
class EventWriter {
 public:
  /// Creates `dir`/events.out.tfevents.<seconds>.<host>.<pid>.medfast with its version
  /// record; OsError naming the path when it cannot be written.
  explicit EventWriter(const std::string& dir);
  EventWriter(EventWriter&&) = default;
  EventWriter& operator=(EventWriter&&) = default;

  void scalar(const std::string& tag, double value, std::int64_t step, double wall_time);
  /// Appends what was recorded since the last flush and fsyncs the file.
  void flush();
  const std::string& path() const { return file_.path(); }

 private:
  os::File file_;
  std::uint64_t size_ = 0;
  std::string pending_;
};

/// Seconds since the Unix epoch (an event's wall_time).
double unix_seconds();

}  // namespace medfast::profile

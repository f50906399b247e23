#include "medfast/core/settings.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <thread>

#include "medfast/core/error.hpp"
#include "medfast/core/field_settings.hpp"
#include "medfast/core/io_options.hpp"
#include "medfast/core/units.hpp"

namespace medfast {

namespace {

SettingDef integer(std::string name, std::int64_t def, std::int64_t lo, std::int64_t hi, std::string desc) {
  SettingDef d;
  d.name = std::move(name);
  d.default_value = std::to_string(def);
  d.description = std::move(desc);
  d.kind = SettingKind::integer;
  d.min = lo;
  d.max = hi;
  return d;
}

SettingDef bytes(std::string name, std::uint64_t def, std::string desc) {
  SettingDef d;
  d.name = std::move(name);
  d.default_value = std::to_string(def);
  d.description = std::move(desc);
  d.kind = SettingKind::bytes;
  return d;
}

SettingDef choice(std::string name, std::string def, std::vector<std::string> choices, std::string desc) {
  SettingDef d;
  d.name = std::move(name);
  d.default_value = std::move(def);
  d.description = std::move(desc);
  d.kind = SettingKind::choice;
  d.choices = std::move(choices);
  return d;
}

SettingDef seconds(std::string name, double def, double max, std::string desc) {
  SettingDef d;
  d.name = std::move(name);
  d.default_value = format_number(def);
  d.description = std::move(desc);
  d.kind = SettingKind::seconds;
  d.max_seconds = max;
  return d;
}

std::vector<SettingDef> make_defs() {
  std::vector<SettingDef> defs = {
      integer("threads", kDefaultThreads, 0, kMaxThreads,
              "threads for libtorch intra-op work and medfast's pools (0: one per core)"),
      choice("log_level", "info", {"debug", "info", "warn", "error", "off"}, "least severe log record printed"),
      choice("progress", "auto", {"auto", "tty", "plain", "off"},
             "progress of long work (auto: a live line on a terminal, else a plain line every 30 s)"),
      integer("gzip_level", kDefaultGzipLevel, 0, 12,
              "compression level for .nii.gz written by medfast (libdeflate: 0 store .. 12 smallest)"),
      bytes("gzip_buffer_limit", kDefaultGzipBufferLimit,
            "compressed files up to this size are inflated in one buffer (libdeflate); larger ones are streamed"),
      bytes("max_volume_bytes", kDefaultMaxVolumeBytes,
            "largest decoded volume a header may announce; larger ones are refused before allocating"),
      choice("host_memory_reuse", "on", {"on", "off"},
             "train, eval and infer keep freed host memory for reuse (glibc: large blocks from the heap, never "
             "returned): no page faults for each forward's tensors; the resident size stays at its peak"),
      choice("conv_backward", "auto", {"auto", "libtorch"},
             "gradients of float32 convolutions on the CPU (auto: a stride-1 convolution's input gradient, and on "
             "libtorch 1.x a transposed convolution's gradients, computed by forward convolutions, which libtorch "
             "runs several times faster; libtorch: its own backward everywhere)"),
      choice("conv_forward", "auto", {"auto", "libtorch"},
             "float32 convolutions on the CPU (auto: with at most 4 output channels and stride 1 on a CPU with "
             "AVX2 or AVX-512, medfast's direct kernel, several times faster than oneDNN's for so few channels; "
             "the others with a kernel of more than one voxel in oneDNN where libtorch would take its im2col "
             "kernel, 5-10x slower for one small volume; libtorch: its own kernels everywhere)"),
      choice("fold_batch_norm", "on", {"on", "off"},
             "validation, eval and infer run a UNet with batch norm folded into its convolutions (the same "
             "outputs up to float rounding, one pass less per layer; off: the trained network as it is)"),
      bytes("buffer_pool_bytes", kDefaultBufferPoolBytes,
            "freed large host buffers kept for reuse, so decoding skips the kernel's zero-fill (0: off)"),
      choice("dist_backend", "auto", {"auto", "gloo", "nccl"},
             "DDP process group (auto: nccl for CUDA training where libtorch has it, else gloo)"),
      seconds("dist_timeout", kDefaultDistTimeoutSeconds, kMaxDistTimeoutSeconds,
              "seconds a rank waits for its peers (rendezvous and every collective)"),
      bytes("dist_bucket_bytes", kDefaultDistBucketBytes,
            "gradients are all-reduced in buckets of about this size, each as soon as its gradients are ready"),
      choice("self_check", "on", {"on", "off"},
             "before the first forward, check libtorch's convolution, matmul and attention against float64 "
             "once per device and dtype; a faulty backend (oneDNN, cuDNN) is switched off, else the run stops"),
  };
  // The engine's options (io::IoOptions' fields), after max_volume_bytes as they always stood.
  const auto at = std::find_if(defs.begin(), defs.end(), [](const SettingDef& d) { return d.name == "max_volume_bytes"; });
  const auto io = setting_defs_of<io::IoOptions>(io::kIoSettingPrefix);
  defs.insert(at + 1, io.begin(), io.end());
  return defs;
}

std::string where(SettingSource source, const std::string& origin) {
  std::string s = source_name(source);
  if (!origin.empty()) s += " " + origin;
  return s;
}

// Returns the canonical text of a valid value, or throws ValueError.
std::string validate(const SettingDef& d, const std::string& value, SettingSource source, const std::string& origin) {
  const std::string ctx = str("setting ", d.name, " = '", value, "' (from ", where(source, origin), ")");
  try {
    switch (d.kind) {
      case SettingKind::integer: {
        const auto v = parse_int(value, ctx);
        if (v < d.min || v > d.max) {
          throw ValueError(str(ctx, ": expected a whole number in ", d.min, "..", d.max));
        }
        return std::to_string(v);
      }
      case SettingKind::bytes:
        return std::to_string(parse_bytes(value));
      case SettingKind::choice:
        if (std::find(d.choices.begin(), d.choices.end(), value) == d.choices.end()) {
          throw ValueError(str(ctx, ": expected one of ", join(d.choices)));
        }
        return value;
      case SettingKind::text:
        return value;
      case SettingKind::seconds: {
        const double v = parse_double(value, ctx);
        if (!(v > 0) || v > d.max_seconds) {
          throw ValueError(str(ctx, ": expected a number of seconds in (0, ", format_number(d.max_seconds), "]"));
        }
        return format_number(v);
      }
    }
  } catch (const ValueError& e) {
    if (e.message().rfind(ctx, 0) == 0) throw;
    throw ValueError(str(ctx, ": ", e.message()));
  }
  return value;
}

}  // namespace

const std::vector<SettingDef>& setting_defs() {
  static const std::vector<SettingDef> defs = make_defs();
  return defs;
}

std::string SettingDef::env_var() const {
  std::string s = "MEDFAST_";
  for (char c : name) s += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string SettingDef::flag() const {
  std::string s = "--";
  for (char c : name) s += c == '_' ? '-' : c;
  return s;
}

const char* source_name(SettingSource source) {
  switch (source) {
    case SettingSource::default_value: return "default";
    case SettingSource::file: return "file";
    case SettingSource::env: return "env";
    case SettingSource::flag: return "flag";
  }
  return "?";
}

const SettingDef& Settings::def(const std::string& name) {
  for (const auto& d : setting_defs()) {
    if (d.name == name) return d;
  }
  std::vector<std::string> names;
  for (const auto& d : setting_defs()) names.push_back(d.name);
  throw ValueError(str("unknown setting '", name, "' (known: ", join(names), ")"));
}

Settings::Settings() {
  for (const auto& d : setting_defs()) {
    entries_[d.name] = Entry{validate(d, d.default_value, SettingSource::default_value, ""),
                             SettingSource::default_value, ""};
  }
}

void Settings::set(const std::string& name, const std::string& value, SettingSource source,
                   const std::string& origin) {
  const SettingDef& d = def(name);
  Entry& e = entries_.at(name);
  if (static_cast<int>(source) < static_cast<int>(e.source)) return;
  e = Entry{validate(d, value, source, origin), source, origin};
}

void Settings::load_env() {
  for (const auto& d : setting_defs()) {
    const std::string var = d.env_var();
    if (const char* v = std::getenv(var.c_str())) set(d.name, v, SettingSource::env, var);
  }
}

void Settings::load_file_values(const std::map<std::string, std::string>& values, const std::string& path) {
  for (const auto& [k, v] : values) {
    try {
      set(k, v, SettingSource::file, path);
    } catch (ValueError& e) {
      e.add_context(str("config file ", path, ", key settings.", k));
      throw;
    }
  }
}

const Settings::Entry& Settings::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) def(name);  // throws with the list of known names
  return it->second;
}

std::int64_t Settings::get_int(const std::string& name) const { return parse_int(get(name), name); }
std::uint64_t Settings::get_bytes(const std::string& name) const { return parse_bytes(get(name)); }

bool parse_bool(const std::string& text, const std::string& what) {
  if (text == "on" || text == "true" || text == "1" || text == "yes") return true;
  if (text == "off" || text == "false" || text == "0" || text == "no") return false;
  throw ValueError(str(what, ": '", text, "' is not on/off"));
}

bool Settings::get_bool(const std::string& name) const { return parse_bool(get(name), name); }
double Settings::get_seconds(const std::string& name) const { return parse_double(get(name), name); }

int Settings::threads() const {
  const auto t = get_int("threads");
  if (t > 0) return static_cast<int>(t);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace medfast

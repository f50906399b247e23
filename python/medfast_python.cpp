// The `medfast._medfast` extension: the engine for Python, over the same library
// the CLI uses. Tensors cross without copies (torch's own pybind11 casters); every
// call that does I/O, waits on the loader or trains releases the GIL; long waits
// check for Ctrl-C. medfast's exceptions become ValueError (bad arguments, configs
// and files), OSError (with errno) and RuntimeError. Importing changes no torch
// setting: threads are set only by calls that train (train.threads).
#include <torch/csrc/utils/pybind.h>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <ATen/ATen.h>
#include <torch/version.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "medfast/core/config.hpp"
#include "medfast/core/error.hpp"
#include "medfast/core/field_settings.hpp"
#include "medfast/core/log.hpp"
#include "medfast/core/rank_env.hpp"
#include "medfast/core/settings.hpp"
#include "medfast/core/units.hpp"
#include "medfast/data/pipeline.hpp"
#include "medfast/image/nifti.hpp"
#include "medfast/image/nifti_raw.hpp"
#include "medfast/io/file_handle.hpp"
#include "medfast/io/tensor_file.hpp"
#include "medfast/io/tensor_io.hpp"
#include "medfast/os/file.hpp"
#include "medfast/train/self_check.hpp"
#include "medfast/train/placement.hpp"
#include "medfast/train/trainer.hpp"
#include "medfast/version.hpp"

namespace py = pybind11;
using namespace medfast;

namespace {

// ---------------------------------------------------------------------------
// Settings: one registry per process, defaults and MEDFAST_* read at import.

Settings& settings() {
  static Settings s = [] {
    Settings r;
    r.load_env();
    return r;
  }();
  return s;
}
std::mutex& settings_mutex() {
  static std::mutex m;
  return m;
}
Settings settings_copy() {
  std::lock_guard<std::mutex> lock(settings_mutex());
  return settings();
}

// ---------------------------------------------------------------------------
// JSON <-> Python through the json module (configs are small).

nlohmann::json to_json(const py::handle& obj) {
  if (obj.is_none()) return nlohmann::json();
  const std::string text = py::module_::import("json").attr("dumps")(obj).cast<std::string>();
  return nlohmann::json::parse(text);
}
py::object from_json(const nlohmann::json& j) { return py::module_::import("json").attr("loads")(j.dump()); }

/// A config given as a dict, or as the path of a YAML/JSON file: (json, path, base folder).
struct ConfigSource {
  nlohmann::json root;
  std::string path, base;
};
ConfigSource config_from(const py::object& config) {
  if (py::isinstance<py::str>(config) || py::hasattr(config, "__fspath__")) {
    const std::string path = py::str(py::module_::import("os").attr("fspath")(config));
    return {data::load_yaml_as_json(path), path, os::parent_directory(path)};
  }
  if (!py::isinstance<py::dict>(config)) {
    throw ValueError("a config is a dict (the run config's sections) or the path of a YAML/JSON file");
  }
  const std::string cwd = py::str(py::module_::import("os").attr("getcwd")());
  return {to_json(config), "config dict", cwd};
}

// ---------------------------------------------------------------------------
// I/O options from keyword arguments (the io_* settings otherwise).

io::IoOptions io_options(const py::kwargs& kw) {
  // Each keyword argument sets its io_* setting for this call (the field's name, checks and
  // messages: core/io_options.hpp); the rest keep the resolved settings.
  Settings s = settings_copy();
  const auto keys = field_keys<io::IoOptions>();
  for (const auto& [k, v] : kw) {
    const std::string key = py::str(k);
    if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
      throw ValueError(str("unknown I/O option '", key, "' (known: ", join(keys), ")"));
    }
    const std::string text = py::isinstance<py::bool_>(v) ? (v.cast<bool>() ? "on" : "off") : std::string(py::str(v));
    s.set(io::kIoSettingPrefix + key, text, SettingSource::flag, "keyword argument " + key);
  }
  return io::IoOptions::from(s);
}

/// The I/O options' keyword arguments and their defaults (the io_* settings as resolved here).
py::dict io_option_defaults() {
  py::dict out;
  const io::IoOptions o = io::IoOptions::from(settings_copy());
  for_each_field(o, [&](const auto& f, const auto& value) { out[f.key] = value; });
  return out;
}

// ---------------------------------------------------------------------------
// Ctrl-C: long native calls check Python's signal flag now and then.

void check_signals() {
  py::gil_scoped_acquire gil;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
}

// ---------------------------------------------------------------------------
// io

class FileHandle {
 public:
  FileHandle(const std::string& path, const std::string& mode, const py::kwargs& kw) {
    if (mode != "r" && mode != "w" && mode != "r+") throw ValueError(str("FileHandle: mode '", mode, "' is not r, w or r+"));
    const auto m = mode == "r" ? io::FileHandle::Mode::read
                   : mode == "w" ? io::FileHandle::Mode::write
                                 : io::FileHandle::Mode::read_write;
    handle_ = std::make_shared<io::FileHandle>(io::FileHandle::open(path, m, io_options(kw)));
  }
  std::size_t pread(const at::Tensor& t, std::uint64_t offset) {
    py::gil_scoped_release nogil;
    return io::read_into(*handle_, t, offset);
  }
  void pwrite(const at::Tensor& t, std::uint64_t offset) {
    py::gil_scoped_release nogil;
    io::write_from(*handle_, t, offset);
  }
  std::uint64_t size() const { return handle_->size(); }
  std::string backend() const { return io::backend_name(handle_->backend()); }
  void sync() {
    py::gil_scoped_release nogil;
    handle_->sync();
  }
  std::shared_ptr<io::FileHandle> handle() const { return handle_; }

 private:
  std::shared_ptr<io::FileHandle> handle_;
};

/// What async_pread/async_pwrite return: wait() gives the bytes moved.
class Future {
 public:
  /// A read: its future gives the bytes read.
  Future(std::shared_future<std::size_t> f, at::Tensor keep, std::shared_ptr<io::FileHandle> handle)
      : f_(std::move(f)), keep_(std::move(keep)), handle_(std::move(handle)) {}
  /// A write of `bytes`: its future gives nothing (or the error).
  Future(std::shared_future<void> w, std::size_t bytes, at::Tensor keep, std::shared_ptr<io::FileHandle> handle)
      : w_(std::move(w)), bytes_(bytes), keep_(std::move(keep)), handle_(std::move(handle)) {}
  std::size_t wait() {
    {
      py::gil_scoped_release nogil;
      while (!ready(std::chrono::milliseconds(100))) check_signals();
    }
    if (w_.valid()) {
      w_.get();
      return bytes_;
    }
    return f_.get();
  }
  bool done() const { return ready(std::chrono::milliseconds(0)); }

 private:
  bool ready(std::chrono::milliseconds wait) const {
    return (w_.valid() ? w_.wait_for(wait) : f_.wait_for(wait)) == std::future_status::ready;
  }
  std::shared_future<std::size_t> f_;
  std::shared_future<void> w_;
  std::size_t bytes_ = 0;
  at::Tensor keep_;                         // the tensor stays alive until the transfer ends
  std::shared_ptr<io::FileHandle> handle_;  // and so does the file
};

// The engine's async calls: on CUDA tensors they follow the caller's current stream
// (torch.cuda.stream(s) in Python), not the worker thread's default one.
Future async_pread(FileHandle& fh, const at::Tensor& t, std::uint64_t offset) {
  auto h = fh.handle();
  std::shared_future<std::size_t> f = io::read_into_async(*h, t, offset).share();
  return Future(f, t, h);
}
Future async_pwrite(FileHandle& fh, const at::Tensor& t, std::uint64_t offset) {
  auto h = fh.handle();
  const std::size_t n = static_cast<std::size_t>(t.numel()) * t.element_size();
  return Future(io::write_from_async(*h, t, offset).share(), n, t, h);
}

// ---------------------------------------------------------------------------
// nifti

py::dict header_dict(const Volume& v) {
  py::dict d;
  d["shape"] = v.shape();
  d["dtype"] = v.dtype_name();
  d["spacing"] = v.spacing();
  d["axcodes"] = v.axcodes();
  d["nifti_version"] = v.meta.nifti_version;
  d["datatype"] = v.meta.disk_datatype;
  d["big_endian"] = v.meta.big_endian;
  d["scl_slope"] = v.meta.scl_slope;
  d["scl_inter"] = v.meta.scl_inter;
  d["qform_code"] = v.meta.qform_code;
  d["sform_code"] = v.meta.sform_code;
  d["xyzt_units"] = v.meta.xyzt_units;
  d["intent_code"] = v.meta.intent_code;
  d["descrip"] = v.meta.descrip;
  d["pixdim"] = v.meta.pixdim;
  d["source"] = v.meta.source;
  return d;
}

at::Tensor affine_tensor(const Affine& a) {
  at::Tensor t = at::empty({4, 4}, at::kDouble);
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) t[i][j] = a(i, j);
  return t;
}

Affine affine_from(const at::Tensor& t) {
  MEDFAST_CHECK_T(ValueError, t.defined() && t.sizes() == at::IntArrayRef({4, 4}), "affine: expected a 4x4 tensor, got ",
                  t.defined() ? t.sizes() : at::IntArrayRef{});
  const at::Tensor d = t.to(at::kCPU, at::kDouble).contiguous();
  Affine a;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) a(i, j) = d[i][j].item<double>();
  return a;
}

// ---------------------------------------------------------------------------
// data

py::dict sample_dict(const Sample& s) {
  py::dict d;
  for (const auto& [k, v] : s.volumes) {
    d[py::str(k)] = v.data;
    d[py::str(k + "_affine")] = affine_tensor(v.affine);
  }
  for (const auto& [k, a] : s.arrays) d[py::str(k)] = a;
  return d;
}

/// A pipeline: the data section of a run config, resolved.
class Pipeline {
 public:
  explicit Pipeline(const py::object& config) {
    // Reading changes nothing process-wide, so pipelines with different settings live side
    // by side; data.synth's dataset is written here when it is missing.
    const ConfigSource src = config_from(config);
    cfg_ = data::open_pipeline(src.root, src.path, src.base, settings_copy());
  }
  const data::PipelineConfig& config() const { return cfg_; }
  std::size_t items() const { return cfg_.dataset.items.size(); }
  std::size_t validation_items() const { return cfg_.validation.items.size(); }

 private:
  data::PipelineConfig cfg_;
};

/// The deterministic chain's cached outputs (torch Dataset semantics in medfast.data).
class CachedDataset {
 public:
  CachedDataset(const Pipeline& p, bool validation, bool fill)
      : cfg_(p.config()),
        ds_(std::make_unique<data::CachedDataset>(validation ? data::make_validation_dataset(cfg_)
                                                             : data::make_cached_dataset(cfg_))) {
    if (fill) this->fill();
  }
  py::dict fill() {
    data::FillReport r;
    {
      py::gil_scoped_release nogil;
      r = ds_->fill();
    }
    py::dict d;
    d["items"] = r.items;
    d["computed"] = r.computed;
    d["reused"] = r.reused;
    d["bytes"] = r.bytes;
    d["seconds"] = r.seconds;
    return d;
  }
  std::size_t size() const { return ds_->size(); }
  py::dict get(std::int64_t i) {
    const auto n = static_cast<std::int64_t>(ds_->size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) throw py::index_error(str("CachedDataset index ", i, " is outside 0..", n - 1));
    Sample s;
    {
      py::gil_scoped_release nogil;
      s = ds_->get(static_cast<std::size_t>(i));
    }
    return sample_dict(s);
  }
  const data::PipelineConfig& config() const { return cfg_; }
  data::CachedDataset& dataset() { return *ds_; }

 private:
  data::PipelineConfig cfg_;
  std::unique_ptr<data::CachedDataset> ds_;
};

/// medfast's threaded loader over a CachedDataset: the config's random chain and
/// data.loader options, overridden by keyword arguments.
class Loader {
 public:
  Loader(std::shared_ptr<CachedDataset> ds, const py::kwargs& kw) : ds_(std::move(ds)) {
    data::LoaderOptions o = ds_->config().loader;
    nlohmann::json overrides = to_json(kw);
    ConfigReader r(overrides, "Loader", ConfigReader::Style::argument);
    r.read("batch_size", o.batch_size).read("threads", o.threads).read("prefetch", o.prefetch);
    r.read("shuffle", o.shuffle).read("drop_last", o.drop_last).read("repeats", o.repeats);
    r.read("device", o.device).read("pin_memory", o.pin_memory);
    r.finish(o);
    data::CachedDataset* raw = &ds_->dataset();
    loader_ = std::make_unique<data::Loader>(
        raw->size(), [raw](std::size_t i) { return raw->get(i); }, data::make_random_chain(ds_->config()), o);
    loader_->set_item_ids([raw](std::size_t i) { return raw->global_index(i); });
  }
  void set_epoch(std::uint64_t e) { epoch_ = e; }
  std::uint64_t epoch() const { return epoch_; }
  void start() {
    py::gil_scoped_release nogil;
    loader_->start(epoch_);
  }
  py::object next() {
    std::optional<data::Batch> b;
    {
      py::gil_scoped_release nogil;
      b = loader_->next(check_signals);
    }
    if (!b) return py::none();
    py::dict d;
    for (const auto& [k, t] : b->tensors) d[py::str(k)] = t;
    d["items"] = b->items;
    return d;
  }
  std::size_t batches() const { return loader_->batches_per_epoch(); }
  void stop() {
    py::gil_scoped_release nogil;
    loader_->stop();
  }

 private:
  std::shared_ptr<CachedDataset> ds_;
  std::unique_ptr<data::Loader> loader_;
  std::uint64_t epoch_ = 0;
};

// ---------------------------------------------------------------------------
// train

py::object train_run(const py::object& config, bool resume, bool overwrite, const py::object& on_epoch) {
  // Under torchrun or srun every process would train alone on its share of the data, with
  // no gradient averaging and every rank writing the same run_dir (issue 21, finding 3).
  if (const RankEnvironment env = RankEnvironment::read(); env.distributed()) {
    throw ValueError(str("medfast.train.run trains in one process, and this one is rank ", env.rank, " of ",
                         env.world_size, " (RANK/WORLD_SIZE or SLURM_PROCID/SLURM_NTASKS are set): for "
                         "distributed training run `medfast launch --nproc N train --config CFG` on each node, "
                         "or `medfast train` under torchrun/srun"));
  }
  const ConfigSource src = config_from(config);
  // A dict's relative paths start at the working directory; its errors name it.
  const std::string path = src.path == "config dict" ? "<the config dict given to medfast.train.run>" : src.path;
  const Settings settings = settings_copy();
  train::prepare_run(src.root, path, settings);  // writes data.synth's dataset when missing
  train::Trainer trainer(src.root, path, settings);
  train::TrainCallbacks cb;
  cb.step = [](int, int, int, double) { check_signals(); };
  if (!on_epoch.is_none()) {
    cb.epoch = [on_epoch](const train::EpochRecord& r) {
      py::gil_scoped_acquire gil;
      on_epoch(from_json(r.to_json()));
    };
  }
  train::TrainResult result;
  {
    py::gil_scoped_release nogil;
    result = trainer.run(resume, cb, overwrite);
  }
  return from_json(result.to_json());
}

py::object check_backends(const std::string& device, const std::string& dtype) {
  at::ScalarType t = at::kFloat;
  if (dtype == "bfloat16" || dtype == "bf16") {
    t = at::kBFloat16;
  } else if (dtype == "float16" || dtype == "fp16") {
    t = at::kHalf;
  } else if (dtype != "float32" && dtype != "fp32") {
    throw ValueError(str("check_backends: dtype '", dtype, "' is not float32, bfloat16 or float16"));
  }
  const c10::Device d = [&] {
    try {
      return c10::Device(device);
    } catch (const c10::Error&) {
      throw ValueError(str("check_backends: device '", device, "' is not cpu, cuda or cuda:N"));
    }
  }();
  train::SelfCheckReport r;
  {
    py::gil_scoped_release nogil;
    r = train::ensure_backends_checked(d, t, settings_copy().get_bool("self_check"));
  }
  return from_json(r.to_json());
}

// The submodules, one function each.

void def_settings(py::module_& m) {
  auto ms = m.def_submodule("settings", "medfast's settings (flag > environment > file > default; here: set > env > default)");
  ms.def("get", [](const std::string& name) { return settings_copy().get(name); }, py::arg("name"));
  ms.def(
      "set",
      [](const std::string& name, const py::object& value) {
        std::lock_guard<std::mutex> lock(settings_mutex());
        settings().set(name, py::str(value), SettingSource::flag, "medfast.settings.set");
      },
      py::arg("name"), py::arg("value"));
  ms.def("show", [] {
    const Settings s = settings_copy();
    py::dict d;
    for (const auto& def : setting_defs()) {
      const auto& e = s.entry(def.name);
      d[py::str(def.name)] = py::make_tuple(e.value, source_name(e.source));
    }
    return d;
  });

  // io
}

void def_io(py::module_& m) {
  auto mio = m.def_submodule("io", "Tensor file I/O through medfast's engine (posix, O_DIRECT, io_uring, cuFile)");
  py::class_<Future>(mio, "Future")
      .def("wait", &Future::wait, "Waits for the transfer; returns the bytes moved")
      .def("done", &Future::done);
  py::class_<FileHandle>(mio, "FileHandle")
      .def(py::init<const std::string&, const std::string&, const py::kwargs&>(), py::arg("path"), py::arg("mode") = "r")
      .def("pread", &FileHandle::pread, py::arg("tensor"), py::arg("offset") = 0)
      .def("pwrite", &FileHandle::pwrite, py::arg("tensor"), py::arg("offset") = 0)
      .def("async_pread", &async_pread, py::arg("tensor"), py::arg("offset") = 0)
      .def("async_pwrite", &async_pwrite, py::arg("tensor"), py::arg("offset") = 0)
      .def("sync", &FileHandle::sync)
      .def_property_readonly("size", &FileHandle::size)
      .def_property_readonly("backend", &FileHandle::backend);
  mio.def("options", &io_option_defaults,
          "The I/O keyword arguments every call here takes (backend, block_size, ...) with their values "
          "from the io_* settings");
  mio.def(
      "load",
      [](const std::string& path, std::optional<at::Tensor> out, const std::string& device, const py::kwargs& kw) {
        const io::IoOptions o = io_options(kw);
        py::gil_scoped_release nogil;
        return io::load_bytes(path, out ? *out : at::Tensor(), device, o);
      },
      py::arg("path"), py::arg("out") = py::none(), py::arg("device") = "cpu");
  mio.def(
      "save",
      [](const at::Tensor& t, const std::string& path, bool durable, const py::kwargs& kw) {
        const io::IoOptions o = io_options(kw);
        py::gil_scoped_release nogil;
        io::save_bytes(t, path, o, durable);
      },
      py::arg("tensor"), py::arg("path"), py::arg("durable") = true);
  mio.def(
      "save_tensor",
      [](const at::Tensor& t, const std::string& path, bool durable, const py::kwargs& kw) {
        const io::IoOptions o = io_options(kw);
        py::gil_scoped_release nogil;
        io::save_tensor(t, path, o, durable);
      },
      py::arg("tensor"), py::arg("path"), py::arg("durable") = true);
  mio.def(
      "load_tensor",
      [](const std::string& path, const std::string& device, bool verify, const py::kwargs& kw) {
        const io::IoOptions o = io_options(kw);
        py::gil_scoped_release nogil;
        return io::load_tensor(path, device, o, verify);
      },
      py::arg("path"), py::arg("device") = "cpu", py::arg("verify") = true);

  // nifti
}

void def_nifti(py::module_& m) {
  auto mn = m.def_submodule("nifti", "NIfTI-1/2 (.nii, .nii.gz) read and written as nibabel does");
  mn.def(
      "load",
      [](const std::string& path) {
        Volume v;
        {
          const NiftiReadOptions o = NiftiReadOptions::from(settings_copy());
          py::gil_scoped_release nogil;
          v = read_nifti(path, o);
        }
        return py::make_tuple(v.data, affine_tensor(v.affine), header_dict(v));
      },
      py::arg("path"));
  mn.def(
      "save",
      [](const std::string& path, const at::Tensor& data, const at::Tensor& affine) {
        Volume v;
        v.data = data;
        v.affine = affine_from(affine);
        const NiftiWriteOptions o = NiftiWriteOptions::from(settings_copy());
        py::gil_scoped_release nogil;
        write_nifti(path, v, o);
      },
      py::arg("path"), py::arg("tensor"), py::arg("affine"));

  // data
}

void def_data(py::module_& m) {
  auto md = m.def_submodule("data", "Cached pipelines and the threaded loader");
  py::class_<Pipeline>(md, "Pipeline")
      .def(py::init<const py::object&>(), py::arg("config"))
      .def_property_readonly("items", &Pipeline::items)
      .def_property_readonly("validation_items", &Pipeline::validation_items);
  py::class_<CachedDataset, std::shared_ptr<CachedDataset>>(md, "CachedDataset")
      .def(py::init<const Pipeline&, bool, bool>(), py::arg("pipeline"), py::arg("validation") = false,
           py::arg("fill") = true)
      .def("fill", &CachedDataset::fill)
      .def("__len__", &CachedDataset::size)
      .def("__getitem__", &CachedDataset::get);
  py::class_<Loader>(md, "Loader")
      .def(py::init<std::shared_ptr<CachedDataset>, const py::kwargs&>(), py::arg("dataset"))
      .def("set_epoch", &Loader::set_epoch, py::arg("epoch"))
      .def_property_readonly("epoch", &Loader::epoch)
      .def("start", &Loader::start)
      .def("next", &Loader::next)
      .def("stop", &Loader::stop)
      .def("__len__", &Loader::batches);

  // train
}

void def_train(py::module_& m) {
  auto mt = m.def_submodule("train", "Training runs from a run config");
  mt.def(
      "default_config",
      [](const std::string& device) {
        const train::DeviceChoice d = train::choose_device(device, "device");
        return from_json(train::default_run_config(d.device, d.bf16));
      },
      py::arg("device") = "auto",
      "The built-in default run config (what `medfast train` runs without --config) for the device `device` "
      "chooses (auto: a GPU where one is usable, with mixed precision and the device cache; else the CPU's), "
      "as a dict");
  mt.def("run", &train_run, py::arg("config"), py::arg("resume") = false, py::arg("overwrite") = false,
         py::arg("on_epoch") = py::none());
  mt.def("check_backends", &check_backends, py::arg("device") = "cpu", py::arg("dtype") = "float32",
         "The backend self-check run() does before its first forward (once per process, device and dtype): "
         "conv3d, matmul and attention against float64; a faulty oneDNN or cuDNN is switched off for the process. "
         "Returns the report as a dict; raises RuntimeError when the math stays wrong");
}

}  // namespace

PYBIND11_MODULE(_medfast, m) {
  m.doc() = "medfast's engine: tensor file I/O, NIfTI, cached pipelines and the threaded loader, training";
  m.attr("__version__") = kVersion;
  m.attr("libtorch_version") = str(TORCH_VERSION_MAJOR, ".", TORCH_VERSION_MINOR, ".", TORCH_VERSION_PATCH);

  // The library logs through a sink the caller sets; Python sees warnings on stderr.
  log::set_sink([](log::Level level, const std::string& message) {
    if (level >= log::Level::warn) std::fprintf(stderr, "medfast: %s: %s\n", log::level_name(level), message.c_str());
  });

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const OsError& e) {
      PyErr_SetObject(PyExc_OSError, py::make_tuple(e.errno_value(), e.what()).ptr());
    } catch (const ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const FormatError& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });

  // settings

  def_settings(m);
  def_io(m);
  def_nifti(m);
  def_data(m);
  def_train(m);
}

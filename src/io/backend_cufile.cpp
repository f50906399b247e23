// The cufile backend: device memory through cuFile (GPUDirect Storage; libcufile loaded by
// shim/cufile.hpp on the first device transfer), host memory as the posix backend moves
// it. Chosen by name (io_backend=cufile: cuFile also in compatibility mode), or for device
// memory alone under io_backend=auto where GPUDirect is there (make_cufile_device_backend:
// host memory stays with the probe's backend). The file is registered with cuFile on first
// use through an O_DIRECT descriptor where the file system allows one (GPUDirect needs it;
// compatibility mode takes any); a file cuFile refuses is said once and bounced.
#include <cerrno>
#include <mutex>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/shim/cufile.hpp"

#include "file_backend.hpp"

namespace medfast::io::detail {

const DevicePath& device_probe() {
  static const DevicePath p = [] {
    DevicePath d;
    std::string why;
    const shim::CuFileApi* api = shim::cufile(&why);
    d.cufile = api != nullptr;
    d.gpudirect = api && !api->compat_mode;
    d.description = shim::cufile_description();
    log::info("io: device transfers: ",
              d.gpudirect ? "cuFile (GPUDirect Storage)"
                          : str("pinned host buffers, double-buffered (", d.description,
                                d.cufile ? "; io_backend=cufile uses it anyway" : "", ")"));
    return d;
  }();
  return p;
}

namespace {

class CufileBackend final : public FileBackend {
 public:
  /// `with_host`: host memory too (through a posix backend); else device memory only.
  CufileBackend(OpenFile& f, bool with_host) : f_(f), host_(with_host ? make_posix_backend(f) : nullptr) {}
  ~CufileBackend() override {
    if (handle_) shim::cufile()->handle_deregister(handle_);
  }

  std::size_t read(const Memory& dst, std::uint64_t off) override {
    if (dst.on_host()) return host().read(dst, off);
    return transfer(dst, off, /*write=*/false);
  }

  void write(const Memory& src, std::uint64_t off) override {
    if (src.on_host()) return host().write(src, off);
    transfer(src, off, /*write=*/true);
  }

  bool reaches_device() override { return handle() != nullptr; }

  std::string device_path() const override {
    return device_probe().gpudirect ? "cufile" : "cufile (compatibility mode)";
  }

 private:
  FileBackend& host() {
    if (!host_) throw Error(str(f_.path, ": the device-only cuFile backend was given host memory"));
    return *host_;
  }

  /// The file registered with cuFile (on first use); null where cuFile is missing or
  /// refuses the file.
  void* handle() {
    std::call_once(once_, [this] {
      const shim::CuFileApi* api = shim::cufile();
      if (!api) return;
      registered_file_ = f_.open_direct_file();
      shim::CUfileDescr d{};
      d.type = shim::kCuFileHandleTypeOpaqueFd;
      d.handle.fd = registered_file_.is_open() ? registered_file_.fd() : f_.file.fd();
      shim::CUfileHandle h = nullptr;
      const shim::CUfileError e = api->handle_register(&h, &d);
      if (e.err == 0) {
        handle_ = h;
      } else {
        log::warn("io: cuFile refused ", f_.path, " (cuFile error ", e.err, "); bouncing through host memory");
      }
    });
    return handle_;
  }

  /// cuFileRead / cuFileWrite of the whole span, continued after short transfers: the
  /// bytes moved (a read stops at end of file; a write that moves nothing is an error).
  /// cuFile moves bytes outside any stream: the caller's stream is waited for first.
  std::size_t transfer(const Memory& m, std::uint64_t offset, bool write) {
    void* h = handle();
    if (!h) throw Error(str(f_.path, ": cuFile refused this file; the engine bounces it (reaches_device is false)"));
    m.device->wait_for_stream();
    const shim::CuFileApi* api = shim::cufile();
    std::size_t pos = 0;
    while (pos < m.size) {
      const auto at = static_cast<off_t>(offset + pos);
      const ssize_t n = write ? api->write(h, m.data, m.size - pos, at, static_cast<off_t>(pos))
                              : api->read(h, m.data, m.size - pos, at, static_cast<off_t>(pos));
      if (n < 0 || (write && n == 0)) {
        throw OsError(str(write ? "cuFileWrite of " : "cuFileRead of ", m.size, " bytes at offset ", offset,
                          write ? " to " : " from ", f_.path, " failed at offset ", offset + pos, " (", n, ")"),
                      EIO);
      }
      if (n == 0) break;
      pos += static_cast<std::size_t>(n);
    }
    return pos;
  }

  OpenFile& f_;
  std::unique_ptr<FileBackend> host_;
  std::once_flag once_;
  void* handle_ = nullptr;
  os::File registered_file_;  // the descriptor registered with cuFile
};

}  // namespace

std::unique_ptr<FileBackend> make_cufile_backend(OpenFile& file) {
  return std::make_unique<CufileBackend>(file, /*with_host=*/true);
}

std::unique_ptr<FileBackend> make_cufile_device_backend(OpenFile& file) {
  return std::make_unique<CufileBackend>(file, /*with_host=*/false);
}

}  // namespace medfast::io::detail

// The posix backend: pread/pwrite of block-sized pieces on the engine's workers, through
// the page cache; host memory only (the engine bounces device memory). Also the host half
// of the cufile backend (backend_cufile.cpp) and what the odirect backend falls back to
// where the file system refuses O_DIRECT.
#include "file_backend.hpp"

namespace medfast::io::detail {

namespace {

class PosixBackend final : public FileBackend {
 public:
  explicit PosixBackend(OpenFile& f) : f_(f) {}

  std::size_t read(const Memory& dst, std::uint64_t off) override {
    char* out = dst.bytes();
    return run_pieces(shared_pool(f_.opt.workers()), off, dst.size, f_.B(),
                      [&](std::uint64_t o, std::size_t l) { return f_.file.read_at(out + (o - off), l, o); });
  }

  void write(const Memory& src, std::uint64_t off) override {
    const char* in = src.bytes();
    run_pieces(shared_pool(f_.opt.workers()), off, src.size, f_.B(), [&](std::uint64_t o, std::size_t l) {
      f_.file.write_at(in + (o - off), l, o);
      return l;
    });
  }

 private:
  OpenFile& f_;
};

}  // namespace

std::unique_ptr<FileBackend> make_posix_backend(OpenFile& file) { return std::make_unique<PosixBackend>(file); }

}  // namespace medfast::io::detail

// The cufile backend's host half: host buffers under the cufile backend move as posix
// does. Device memory goes through cuFile (GPUDirect Storage) in tensor_io.cpp, with the
// file registered by FileHandle::cufile_handle().
#include "file_backend.hpp"

namespace medfast::io::detail {

std::unique_ptr<FileBackend> make_cufile_backend(OpenFile& file) { return make_posix_backend(file); }

}  // namespace medfast::io::detail

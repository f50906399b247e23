#pragma once
/// \file
/// Checkpoint files. One file holds a run's model (parameters and buffers),
/// the optimizer's state and a JSON document (epoch, config, history, best
/// metric, loss-scaler state):
///
///   bytes 0-7    magic "MFCKPT01"
///   bytes 8-15   JSON length J (little-endian u64)
///   bytes 16-23  archive length A
///   bytes 24-31  XXH3-64 of the J + A bytes that follow
///   J bytes      the JSON document
///   A bytes      a torch::serialize archive: "model.<name>" tensors and an
///                "optimizer" sub-archive
///
/// Files are written to a temporary name, fsynced and renamed (os::AtomicWriter),
/// so a crash leaves the previous checkpoint; a reader verifies the checksum and
/// names the file and the tensor that does not fit.
#include <nlohmann/json.hpp>
#include <map>
#include <string>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace medfast::train {

/// Writes `module` (and `optimizer` if given) with `meta` to `path` atomically. Every tensor
/// is written contiguous (NCDHW), whatever layout it has in memory (nn/layout.hpp), as
/// PyTorch and MONAI expect files; the optimizer's state is laid out so for the write and
/// put back after it.
void save_checkpoint(const std::string& path, const torch::nn::Module& module, torch::optim::Optimizer* optimizer,
                     const nlohmann::json& meta);

/// Reads `path` into `module` (and `optimizer` if given); returns the JSON document.
/// Throws FormatError naming the file (damaged, not a checkpoint, a tensor missing or of another shape).
nlohmann::json load_checkpoint(const std::string& path, torch::nn::Module& module, torch::optim::Optimizer* optimizer);

/// Only the JSON document (verifies the checksum too).
nlohmann::json read_checkpoint_meta(const std::string& path);

/// The network's tensors as the file stores them (names without the "model." prefix, on
/// the CPU, with their stored strides), and, where the file holds an optimizer's state, its
/// tensors under "optimizer/<key>". For inspection and tests; FormatError as load_checkpoint.
std::map<std::string, at::Tensor> read_checkpoint_tensors(const std::string& path);

}  // namespace medfast::train

#pragma once
/// \file
/// Bring your MONAI model: loads a state_dict written by
/// `torch.save(model.state_dict(), FILE)` from MONAI's UNet, SegResNet or SwinUNETR into
/// medfast's network built with the same arguments. medfast's parameter and buffer names
/// are MONAI's (`model.0.conv.unit0.conv.weight`, `convInit.conv.weight`,
/// `swinViT.layers1.0.blocks.0.attn.qkv.weight`, ...), so the state_dict loads by name;
/// a leading `module.` (a DistributedDataParallel model's state_dict) is stripped.
///
/// Configured as `model.pretrained: FILE` in a run config (fine-tuning, eval, infer).

#include <torch/nn/module.h>

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace medfast::nn {

struct PretrainedReport {
  std::size_t tensors = 0;  ///< parameters and buffers loaded
  std::size_t elements = 0;
};

/// Copies every parameter and buffer of `module` from the state_dict in `path` (torch.save's
/// zip format, as written by PyTorch >= 1.6). The file must hold exactly the module's names
/// with the module's shapes (dtype is converted). Throws FormatError naming the file and the
/// first missing, unexpected or mis-shaped key (with both shapes), and OsError when the file
/// cannot be read. The module is unchanged when anything is wrong.
PretrainedReport load_state_dict_file(const std::string& path, torch::nn::Module& module);

/// `module`'s parameters and buffers by name, in PyTorch's state_dict order (each module's
/// own parameters, then its own buffers, then its children's, depth first).
std::vector<std::pair<std::string, at::Tensor>> state_dict_of(const torch::nn::Module& module);

/// Writes `module`'s state_dict to `path` as torch.save(model.state_dict(), path) would
/// (the zip format; `torch.load(path, weights_only=True)` reads it on PyTorch >= 1.13),
/// atomically (a temporary name, fsync, rename). Returns the bytes written. What
/// load_state_dict_file reads back is bit for bit the module's tensors.
std::size_t save_state_dict_file(const std::string& path, const torch::nn::Module& module);

}  // namespace medfast::nn

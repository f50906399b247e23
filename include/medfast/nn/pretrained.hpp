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

}  // namespace medfast::nn

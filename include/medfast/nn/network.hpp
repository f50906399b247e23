#pragma once
/// \file
/// Networks by name, from a config's `model` section:
///
///   model: {name: UNet, in_channels: 1, out_channels: 2, channels: [16, 32, 64, 128, 256],
///           strides: [2, 2, 2, 2], num_res_units: 2, norm: batch}
///   model: {name: SegResNet, init_filters: 16, in_channels: 4, out_channels: 3, ...}
///   model: {name: SwinUNETR, img_size: [96, 96, 96], feature_size: 48, use_v2: false, ...}
///
/// Argument names are MONAI's. Unknown names and arguments are errors.
#include <torch/nn/modules/container/any.h>

#include <nlohmann/json.hpp>
#include <variant>

#include "medfast/nn/segresnet.hpp"
#include "medfast/nn/swin_unetr.hpp"
#include "medfast/nn/unet.hpp"

namespace medfast::nn {

using NetworkOptions = std::variant<UNetOptions, SegResNetOptions, SwinUNETROptions>;

/// The validated options a `model` section describes, without building the
/// network (cheap: a run config is checked whole before any data is prepared).
/// Throws ValueError naming the key, as make_network does.
NetworkOptions parse_network(const nlohmann::json& spec, const std::string& where = "model");

/// The network a `model` section describes. Throws ValueError naming the key
/// (with `where`, e.g. the config file, in the message).
torch::nn::AnyModule make_network(const nlohmann::json& spec, const std::string& where = "model");

}  // namespace medfast::nn

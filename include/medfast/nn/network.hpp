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
///
/// A network is its own source file, holding its options (with fields(): one
/// declaration per argument), its module and its entry function (one line:
/// detail::network_spec<Options, Module>), and one line in network.cpp's table.
#include <torch/nn/modules/container/any.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "medfast/core/config.hpp"
#include "medfast/core/fields.hpp"

namespace medfast::nn {

/// A `model` section read and checked, without building the network (cheap: a run
/// config is checked whole before any data is prepared): the network's name, its
/// arguments with every default filled in (what a config written back says), and how
/// to build it.
struct NetworkSpec {
  std::string name;
  nlohmann::json arguments;
  std::function<torch::nn::AnyModule()> build;
  std::vector<FieldDoc> docs;  ///< the network's key table (its options' field list)
  /// For inference (eval mode, no gradients): a network computing the same function with
  /// less work, made from the trained one (UNet with batch norm: each batch norm folded
  /// into the convolution before it). Empty where the network has nothing to fold.
  std::function<torch::nn::AnyModule(const torch::nn::AnyModule&)> for_inference;
  /// Deep supervision: in training mode the network returns one output per weight, stacked
  /// on axis 1 (the full-size output first); the loss is their weighted sum. Empty: one output.
  std::vector<double> deep_supervision_weights;
};

/// Reads a `model` section. Throws ConfigError naming the key (with `where`, e.g. the
/// config file, in the message) for an unknown network or argument or a bad value.
NetworkSpec parse_network(const nlohmann::json& spec, const std::string& where = "model");

/// The network a `model` section describes (parse_network, build, and the weights of
/// `pretrained` if it names a file). Throws as parse_network does.
torch::nn::AnyModule make_network(const nlohmann::json& spec, const std::string& where = "model");

/// The classes a network predicts: its out_channels argument (default included).
/// ConfigError naming `where` if the network has no such argument.
std::int64_t output_channels(const NetworkSpec& spec, const std::string& where = "model");

/// The network to run for inference: spec.for_inference(trained), a new network on trained's
/// device in eval mode that shares no tensor with `trained` (training may go on changing
/// it), or `trained` itself where the spec has no such function. Its outputs equal trained's
/// eval outputs up to float rounding (tested against MONAI's goldens).
torch::nn::AnyModule inference_network(const NetworkSpec& spec, const torch::nn::AnyModule& trained);

/// `tensors` without repeats (the same tensor twice, as libtorch's Module::parameters() lists
/// a module registered under two names, e.g. DynUNet's skip_layers), first occurrences in
/// order. What optimizers, loss scalers, gradient sync and counts must be given.
std::vector<at::Tensor> unique_tensors(const std::vector<at::Tensor>& tensors);

/// The network names parse_network knows, in the table's order.
std::vector<std::string> network_names();

namespace detail {

/// Builds a module, prefixing its argument errors with where it was configured.
template <typename F>
auto construct(const std::string& where, F&& f) {
  try {
    return f();
  } catch (const ConfigError&) {
    throw;
  } catch (const ValueError& e) {
    throw ConfigError(str(where, ": ", e.what()));
  }
}

/// What a network's entry in the table does with its arguments: reads Options' fields
/// (fields()), refuses keys it does not declare, validates, and returns the spec that
/// builds Module (a TORCH_MODULE holder taking Options).
template <typename Options, typename Module>
NetworkSpec network_spec(ConfigReader& arguments, const std::string& name, const std::string& where) {
  Options o;
  read_fields(arguments, o);
  arguments.finish();
  construct(where, [&] { o.validate(); });
  return NetworkSpec{name, fields_json(o), [o] { return torch::nn::AnyModule(Module(o)); }, field_docs<Options>(), {}, {}};
}

}  // namespace detail

}  // namespace medfast::nn

#include "medfast/nn/network.hpp"

#include <torch/torch.h>

#include <unordered_set>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/core/registry.hpp"
#include "medfast/nn/pretrained.hpp"

namespace medfast::nn {

// Name, entry (defined in the network's file: one line, detail::network_spec<Options, Module>).
// A new network: its file and one row here.
#define MEDFAST_NETWORKS(X)                  \
  X("UNet", unet_network)           /* unet.cpp */ \
  X("SegResNet", segresnet_network) /* segresnet.cpp */ \
  X("SwinUNETR", swin_unetr_network) /* swin_unetr.cpp */ \
  X("DynUNet", dynunet_network)     /* dynunet.cpp */

#define MEDFAST_NETWORK_ENTRY(name, entry) NetworkSpec entry(ConfigReader& arguments, const std::string& where);
MEDFAST_NETWORKS(MEDFAST_NETWORK_ENTRY)
#undef MEDFAST_NETWORK_ENTRY

namespace {

constexpr Registered<NetworkSpec (*)(ConfigReader&, const std::string&)> kNetworks[] = {
    MEDFAST_NETWORKS(MEDFAST_REGISTRY_ROW)};

}  // namespace

std::vector<std::string> network_names() { return registered_names(kNetworks); }

std::int64_t output_channels(const NetworkSpec& spec, const std::string& where) {
  const auto it = spec.arguments.find("out_channels");
  if (it == spec.arguments.end() || !it->is_number_integer()) {
    throw ConfigError(str(where, ": network ", spec.name, " has no out_channels argument (the classes it predicts)"));
  }
  return it->get<std::int64_t>();
}

NetworkSpec parse_network(const nlohmann::json& spec, const std::string& where) {
  if (!spec.is_object() || !spec.contains("name") || !spec["name"].is_string()) {
    throw ConfigError(str(where, ": expected a mapping with a 'name' (", registered_text(kNetworks, " or "), ")"));
  }
  const std::string name = spec["name"];
  ConfigReader a(spec, where, ConfigReader::Naming{ConfigReader::Style::argument, "argument", name});
  a.known("name");
  if (spec.contains("pretrained") && !spec["pretrained"].is_string() && !spec["pretrained"].is_null()) {
    throw ConfigError(str(where, ".pretrained: expected a file name (a state_dict saved by torch.save), got ",
                          spec["pretrained"].dump()));
  }
  a.known("pretrained");
  if (const auto* row = find_registered(kNetworks, name)) return row->make(a, where);
  throw ConfigError(str(where, ".name: unknown network '", name, "' (expected ", registered_text(kNetworks, " or "), ")"));
}

torch::nn::AnyModule make_network(const nlohmann::json& spec, const std::string& where) {
  const NetworkSpec parsed = parse_network(spec, where);
  torch::nn::AnyModule net = detail::construct(where, [&] { return parsed.build(); });
  if (spec.contains("pretrained") && spec["pretrained"].is_string()) {
    const std::string file = spec["pretrained"].get<std::string>();
    const PretrainedReport r = load_state_dict_file(file, *net.ptr());
    log::info(where, ": ", r.tensors, " tensors (", r.elements, " values) from ", file);
  }
  return net;
}

std::vector<at::Tensor> unique_tensors(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  std::unordered_set<const void*> seen;
  for (const auto& t : tensors) {
    if (seen.insert(t.unsafeGetTensorImpl()).second) out.push_back(t);
  }
  return out;
}

torch::nn::AnyModule inference_network(const NetworkSpec& spec, const torch::nn::AnyModule& trained) {
  if (!spec.for_inference) return trained;
  return spec.for_inference(trained);
}

}  // namespace medfast::nn

#undef MEDFAST_NETWORKS

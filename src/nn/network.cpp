#include "medfast/nn/network.hpp"

#include <torch/torch.h>

#include "medfast/core/error.hpp"
#include "medfast/core/log.hpp"
#include "medfast/nn/pretrained.hpp"

namespace medfast::nn {

// The networks, each defined in its own file (unet.cpp, segresnet.cpp, swin_unetr.cpp).
// A new network: its file, its entry function declared here and one row in the table.
NetworkSpec unet_network(ConfigReader& arguments, const std::string& where);
NetworkSpec segresnet_network(ConfigReader& arguments, const std::string& where);
NetworkSpec swin_unetr_network(ConfigReader& arguments, const std::string& where);

namespace {

struct NetworkEntry {
  const char* name;
  NetworkSpec (*read)(ConfigReader& arguments, const std::string& where);
};

constexpr NetworkEntry kNetworks[] = {
    {"UNet", &unet_network},
    {"SegResNet", &segresnet_network},
    {"SwinUNETR", &swin_unetr_network},
};

/// "UNet, SegResNet or SwinUNETR"
std::string names_text() {
  std::string out;
  const std::size_t n = std::size(kNetworks);
  for (std::size_t i = 0; i < n; ++i) out += str(i == 0 ? "" : i + 1 == n ? " or " : ", ", kNetworks[i].name);
  return out;
}

}  // namespace

std::vector<std::string> network_names() {
  std::vector<std::string> names;
  for (const auto& e : kNetworks) names.push_back(e.name);
  return names;
}

NetworkSpec parse_network(const nlohmann::json& spec, const std::string& where) {
  if (!spec.is_object() || !spec.contains("name") || !spec["name"].is_string()) {
    throw ConfigError(str(where, ": expected a mapping with a 'name' (", names_text(), ")"));
  }
  const std::string name = spec["name"];
  ConfigReader a(spec, where, ConfigReader::Naming{ConfigReader::Style::argument, "argument", name});
  a.known("name");
  if (spec.contains("pretrained") && !spec["pretrained"].is_string() && !spec["pretrained"].is_null()) {
    throw ConfigError(str(where, ".pretrained: expected a file name (a state_dict saved by torch.save), got ",
                          spec["pretrained"].dump()));
  }
  a.known("pretrained");
  for (const auto& e : kNetworks) {
    if (name == e.name) return e.read(a, where);
  }
  throw ConfigError(str(where, ".name: unknown network '", name, "' (expected ", names_text(), ")"));
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

}  // namespace medfast::nn

#pragma once
// What both command-line binaries share (torch-free): the settings flags generated from the
// registry, --config-file, and resolving settings (flag > env > file > default) once parsed.
#include <map>
#include <string>

#include "commands.hpp"

namespace medfast::cli {

/// The top-level app both binaries build: name, --version, one subcommand required,
/// settings flags anywhere (one per registered setting) and --config-file.
void configure_app(CLI::App& app, Context& ctx, std::map<std::string, std::string>& flag_values);

/// After parsing: the settings file, the environment and the flags given, then the log
/// level and sink and the host buffer pool.
void resolve_settings(const CLI::App& app, Context& ctx, const std::map<std::string, std::string>& flag_values);

/// A parse error's message and exit code (CLI11's), except that a first word that is no
/// command is named as such ("A subcommand is required" said nothing about it).
int exit_on_parse_error(CLI::App& app, const CLI::ParseError& e);

/// "medfast X (libtorch A.B.C)": the libtorch version the build was configured with.
std::string version_string();

/// The commands that need libtorch, with their one-line descriptions: the light front
/// hands these to the full binary.
const std::vector<std::pair<std::string, std::string>>& torch_commands();

}  // namespace medfast::cli

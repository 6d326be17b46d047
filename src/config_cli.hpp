// Command-line options for every config key, generated from config_schema() so that `--help`
// lists exactly the keys the JSON files accept.
#pragma once
#include <cctype>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "config.hpp"

namespace codagpt {

// Adds `--<key> VALUE` for every schema key and a repeatable `--set KEY=VALUE`. Each occurrence
// appends "key=VALUE" to `overrides` as it is parsed, so later flags win in command-line order;
// the caller passes `overrides` to apply_overrides() after load_config(), which parses the values
// and reports bad ones by key.
inline void add_config_options(CLI::App& app, std::vector<std::string>& overrides) {
    const std::string group = "Config keys (override the --config file)";
    for (const ConfigKey& key : config_schema()) {
        const std::string name = key.name;
        std::string type = key.type;
        for (char& ch : type) ch = char(std::toupper(static_cast<unsigned char>(ch)));
        // trigger_on_parse runs the callback at each occurrence instead of once per option after
        // parsing, which would lose the command-line order between different options.
        app.add_option_function<std::string>(
               "--" + name, [&overrides, name](const std::string& value) { overrides.push_back(name + "=" + value); },
               key.help)
            ->type_name(type)
            ->trigger_on_parse()
            ->group(group);
    }
    app.add_option_function<std::string>(
           "--set", [&overrides](const std::string& key_value) { overrides.push_back(key_value); },
           "set any config key, e.g. --set lr=3e-4 (repeatable)")
        ->type_name("KEY=VALUE")
        ->trigger_on_parse()
        ->group(group);
}

}  // namespace codagpt

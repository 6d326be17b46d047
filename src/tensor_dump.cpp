#include "tensor_dump.hpp"

#include <sys/stat.h>

#include <cstdlib>
#include <set>
#include <sstream>
#include <string>

#include "common.hpp"
#include "fileio.hpp"

namespace codagpt {

namespace {

struct DumpSpec {
    std::string env;  // the CODAGPT_DUMP value it was parsed from
    std::string dir;
    std::set<int> layers;
};

DumpSpec parse(const std::string& v) {
    DumpSpec d{v, "", {}};
    if (v.empty()) return d;
    const size_t colon = v.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == v.size())
        throw Error("CODAGPT_DUMP must be DIR:LAYER[,LAYER...], got '" + one_line(v) + "'");
    d.dir = v.substr(0, colon);
    std::stringstream list(v.substr(colon + 1));
    for (std::string item; std::getline(list, item, ',');) {
        char* end = nullptr;
        const long l = std::strtol(item.c_str(), &end, 10);
        if (item.empty() || *end || l < 0 || l > 1 << 20)
            throw Error("CODAGPT_DUMP: '" + one_line(item) + "' is not a layer number");
        d.layers.insert((int)l);
    }
    struct stat st {};
    if (stat(d.dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
        throw Error("CODAGPT_DUMP: no directory " + one_line(d.dir));
    return d;
}

// Parsed again when the variable changes (tests set it between runs in one process); the models
// ask for every layer of every step, so the usual case is one getenv and one compare, no allocation.
const DumpSpec& spec() {
    static DumpSpec s;
    const char* env = std::getenv("CODAGPT_DUMP");
    if (!env) env = "";
    if (s.env != env) s = parse(env);
    return s;
}

}  // namespace

bool dump_layer(int layer) { return spec().layers.count(layer) > 0; }

bool check_dump_env() { return !spec().layers.empty(); }

void dump_tensor(const char* name, int layer, const float* data, size_t n) {
    const std::string path = spec().dir + "/" + name + "_" + std::to_string(layer) + ".f32";
    struct stat st {};
    if (stat(path.c_str(), &st) == 0) return;
    write_file_atomic(path, std::string_view(reinterpret_cast<const char*>(data), n * sizeof(float)));
}

}  // namespace codagpt

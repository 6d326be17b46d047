// Checkpoints on the CPU reference: the file format round trip, resume that continues bit for bit
// (backend level and whole runs, stopped by --stop-after and by a real SIGINT), keep-last-K,
// every refusal with its message, and writes that fail or crash half-way.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include "backend.hpp"
#include "checkpoint.hpp"
#include "common.hpp"
#include "config.hpp"
#include "data.hpp"
#include "fileio.hpp"
#include "optim_cpu.hpp"
#include "rng.hpp"
#include "train.hpp"
#include "train_fixture.hpp"

namespace fs = std::filesystem;
using namespace codagpt;
using codagpt::test::read_bytes;
using codagpt::test::same_bits;
using codagpt::test::SyntheticRun;
using nlohmann::json;

namespace {

void write_bytes(const fs::path& p, const std::string& bytes) { std::ofstream(p, std::ios::binary) << bytes; }

template <class F>
std::string error_of(F&& f) {
    try {
        f();
    } catch (const Error& e) {
        return e.what();
    }
    return "(no error)";
}


void expect_same_state(const TrainState& a, const TrainState& b) {
    EXPECT_TRUE(same_bits(a.params, b.params));
    EXPECT_TRUE(same_bits(a.m, b.m));
    EXPECT_TRUE(same_bits(a.v, b.v));
    EXPECT_EQ(a.t, b.t);
}

// Train, val shards of a learnable sequence; the train shard is small (31 windows of 4 x 16) so
// that runs of a few dozen steps cross epochs and resume inside a shuffled later epoch.
struct CheckpointTest : ::testing::Test {
    SyntheticRun synth{"test-ckpt", ModelConfig{/*n_layer=*/1, /*n_head=*/2, /*n_embd=*/32, /*max_seq_len=*/16, /*vocab_size=*/256}, 4, 16, 2000, 1000};
    fs::path dir = synth.dir.path;
    TrainConfig& cfg = synth.cfg;
    void SetUp() override {
        cfg.steps = 40;
        cfg.warmup_steps = 3;
        cfg.lr = 1e-2;
        cfg.eval_every = 10;
        cfg.eval_batches = 2;
    }

    // A checkpoint of a few real steps (non-trivial weights, moments and loader position).
    Checkpoint trained_checkpoint(int steps) {
        auto model = make_cpu_backend(cfg);
        DataLoader data(cfg.train_data, cfg.batch_size, cfg.seq_len, 0, 1, cfg.shuffle, cfg.seed, cfg.model.vocab_size);
        std::vector<double> losses;
        train_steps(*model, data, 0, steps, losses);
        return Checkpoint{cfg, steps, data.state(), model->save_state()};
    }

    // What run_train's loop does per step, without the logging.
    void train_steps(TrainBackend& model, DataLoader& data, int from, int to, std::vector<double>& losses) {
        std::vector<int> in((size_t)cfg.batch_size * cfg.seq_len), tgt(in.size());
        for (int step = from; step < to; step++) {
            model.zero_grad();
            double loss = 0;
            for (int micro = 0; micro < cfg.grad_accum; micro++) {
                data.next_batch(in.data(), tgt.data());
                loss += model.forward_backward(in.data(), tgt.data(), 1.0f / cfg.grad_accum);
            }
            model.update(lr_at(cfg, step), cfg);
            losses.push_back(loss / cfg.grad_accum);
        }
    }

    int run(const std::string& out, const std::string& resume = "", int stop_after = 0) {
        cfg.out_dir = (dir / out).string();
        TrainOptions opt;
        opt.device = "cpu";
        opt.quiet = true;
        opt.resume = resume;
        opt.stop_after = stop_after;
        return run_train(cfg, opt);
    }
    std::vector<json> metrics(const std::string& out) {
        std::vector<json> lines;
        std::ifstream f(dir / out / "metrics.jsonl");
        for (std::string line; std::getline(f, line);) lines.push_back(json::parse(line));
        return lines;
    }
};

// The metrics lines without wall-clock fields: what must be identical between runs.
std::vector<json> deterministic(std::vector<json> lines) {
    for (json& j : lines) {
        j.erase("ms");
        j.erase("tok_s");
    }
    return lines;
}

// A checkpoint file taken apart: header fields, metadata and tensor data, and put back together
// with a fresh checksum (to make files that are intact but wrong inside).
struct Parts {
    uint32_t version;
    json meta;
    std::string data;
};
Parts split(const std::string& file) {
    uint32_t version, m;
    uint64_t d;
    std::memcpy(&version, file.data() + 8, 4);
    std::memcpy(&m, file.data() + 12, 4);
    std::memcpy(&d, file.data() + 16, 8);
    const size_t start = (24 + m + 63) / 64 * 64;
    return {version, json::parse(file.substr(24, m)), file.substr(start, d)};
}
std::string join(const Parts& p) {
    const std::string text = p.meta.dump();
    const uint32_t m = (uint32_t)text.size();
    const uint64_t d = p.data.size();
    std::string out(24, '\0');
    std::memcpy(out.data(), "CODAGPTC", 8);
    std::memcpy(out.data() + 8, &p.version, 4);
    std::memcpy(out.data() + 12, &m, 4);
    std::memcpy(out.data() + 16, &d, 8);
    out += text;
    out.resize((out.size() + 63) / 64 * 64, '\0');
    out += p.data;
    const uint32_t crc = crc32(out.data(), out.size());
    out.append(reinterpret_cast<const char*>(&crc), 4);
    return out;
}

}  // namespace

TEST(Crc32, MatchesZlib) {
    const char* check = "123456789";
    EXPECT_EQ(crc32(check, 9), 0xCBF43926u);  // the standard check value of CRC-32/ISO-HDLC (zlib)
    EXPECT_EQ(crc32(check + 4, 5, crc32(check, 4)), 0xCBF43926u);  // continued in pieces
    EXPECT_EQ(crc32("", 0), 0u);
}

TEST(AtomicFileWriter, AbandonedWriteLeavesTheOldFileAndNoTemporary) {
    const fs::path dir = fs::temp_directory_path() / ("codagpt_fileio_" + std::to_string(::getpid()));
    fs::create_directories(dir);
    const std::string path = (dir / "f.bin").string();
    write_file_atomic(path, "old");
    {
        AtomicFileWriter w(path);
        w.write("new bytes", 9);
        EXPECT_TRUE(fs::exists(w.temp_path()));
    }  // no commit
    EXPECT_EQ(read_bytes(path), "old");
    EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 1);
    AtomicFileWriter w(path);
    w.write("new", 3);
    w.write(" bytes", 6);
    w.commit();
    EXPECT_EQ(read_bytes(path), "new bytes");
    EXPECT_THROW(w.write("x", 1), Error);
    fs::remove_all(dir);
}

TEST_F(CheckpointTest, RoundTripKeepsEveryFieldAndTheLayoutIsAsDocumented) {
    Checkpoint ck = trained_checkpoint(3);
    ck.step = 17;
    ck.train_loader = {2, 5};
    ck.state.t = 17;
    const fs::path path = dir / "ckpt_17.bin";
    save_checkpoint(path.string(), ck);

    const Checkpoint back = load_checkpoint(path.string());
    EXPECT_EQ(config_to_json(back.config), config_to_json(ck.config));
    EXPECT_EQ(back.step, 17);
    EXPECT_EQ(back.train_loader.epoch, 2u);
    EXPECT_EQ(back.train_loader.next, 5u);
    expect_same_state(back.state, ck.state);

    const std::string file = read_bytes(path);
    const size_t n = ck.state.params.size();
    const Parts parts = split(file);
    EXPECT_EQ(file.substr(0, 8), "CODAGPTC");
    EXPECT_EQ(parts.version, kCheckpointVersion);
    EXPECT_EQ(parts.data.size(), 3 * n * sizeof(float));
    EXPECT_EQ(join(parts), file);  // nothing else in the file: header, metadata, padding, data, CRC
    EXPECT_EQ(std::memcmp(parts.data.data(), ck.state.params.data(), n * sizeof(float)), 0);  // param.* first
    EXPECT_EQ(parts.meta["format"], "codagpt checkpoint");
    EXPECT_EQ(parts.meta["step"], 17);
    EXPECT_EQ(parts.meta["adamw_t"], 17);
    const json& table = parts.meta["tensors"];
    ASSERT_EQ(table.size(), 3 * param_layout(cfg.model).size());
    EXPECT_EQ(table[0]["name"], "param.wte");
    EXPECT_EQ(table[0]["dtype"], "f32");
    EXPECT_EQ(table[0]["offset"], 0);
    EXPECT_EQ(table[0]["size"], cfg.model.padded_vocab() * cfg.model.n_embd * 4);
    EXPECT_EQ(table.back()["name"], "adam_v.lnf_b");
}

TEST_F(CheckpointTest, BackendResumeIsBitExact) {
    const int N = 40, K = 35;  // K lies in the second (shuffled) epoch of 31 windows
    cfg.grad_accum = 1;
    std::vector<double> straight, split_losses;
    TrainState straight_state;
    {
        auto model = make_cpu_backend(cfg);
        DataLoader data(cfg.train_data, 4, 16, 0, 1, cfg.shuffle, cfg.seed, 256);
        train_steps(*model, data, 0, N, straight);
        straight_state = model->save_state();
    }
    const std::string path = (dir / "ckpt.bin").string();
    {
        auto model = make_cpu_backend(cfg);
        DataLoader data(cfg.train_data, 4, 16, 0, 1, cfg.shuffle, cfg.seed, 256);
        train_steps(*model, data, 0, K, split_losses);
        ASSERT_EQ(data.state().epoch, 1u);
        save_checkpoint(path, Checkpoint{cfg, K, data.state(), model->save_state()});
    }
    {
        // As a new process would: a fresh backend (initialised from another seed, so that every
        // weight must come from the file) and a fresh loader.
        TrainConfig other = cfg;
        other.seed = 4242;
        auto model = make_cpu_backend(other);
        DataLoader data(cfg.train_data, 4, 16, 0, 1, cfg.shuffle, cfg.seed, 256);
        const Checkpoint ck = load_checkpoint(path);
        check_resumable(ck, cfg, path);
        model->load_state(ck.state);
        data.set_state(ck.train_loader);
        train_steps(*model, data, ck.step, N, split_losses);
        expect_same_state(model->save_state(), straight_state);
    }
    EXPECT_EQ(split_losses, straight);  // exact
}

TEST_F(CheckpointTest, ResumedRunMatchesTheUninterruptedRun) {
    cfg.grad_accum = 2;
    cfg.ckpt_every = 40;  // only the final checkpoint, to compare the final weights
    ASSERT_EQ(run("straight"), 0);

    // Stopped after step 17 as on SIGINT: a checkpoint and exit code 0, no final evaluation.
    ASSERT_EQ(run("split", "", /*stop_after=*/17), 0);
    const auto stopped = list_checkpoints(cfg.out_dir);
    ASSERT_EQ(stopped.size(), 1u);
    EXPECT_EQ(stopped[0].step, 17);
    // A crash after that checkpoint would have left lines of later steps and a torn last line:
    // the resumed run redoes those steps and must not keep them twice.
    {
        std::ofstream f(fs::path(cfg.out_dir) / "metrics.jsonl", std::ios::app);
        f << "{\"step\": 18, \"loss\": 9.0}\n{\"step\": 20, \"val_loss\": 9.0}\n{\"step\": 19, \"lo";
    }
    ASSERT_EQ(run("split", "latest"), 0);

    const auto a = deterministic(metrics("straight")), b = deterministic(metrics("split"));
    ASSERT_EQ(a.size(), 40u + 5u);  // every step, and evaluations at 0, 10, 20, 30 and the end
    EXPECT_EQ(a, b);                // losses, learning rates, norms and validation losses, exactly
    const Checkpoint fa = load_checkpoint(checkpoint_path((dir / "straight").string(), 40));
    const Checkpoint fb = load_checkpoint(checkpoint_path((dir / "split").string(), 40));
    expect_same_state(fa.state, fb.state);
    EXPECT_EQ(fa.train_loader.epoch, fb.train_loader.epoch);
    EXPECT_EQ(fa.train_loader.next, fb.train_loader.next);
}

// --resume auto, as a requeued job runs: a new run where out_dir holds no checkpoint, the newest
// checkpoint's continuation where it does, and at the end nothing left to do. The lines are the
// uninterrupted run's.
TEST_F(CheckpointTest, ResumeAutoStartsThenContinues) {
    cfg.ckpt_every = 40;
    ASSERT_EQ(run("straight"), 0);
    ASSERT_EQ(run("auto", "auto", /*stop_after=*/13), 0);
    ASSERT_EQ(list_checkpoints(cfg.out_dir).size(), 1u);
    EXPECT_EQ(list_checkpoints(cfg.out_dir)[0].step, 13);
    ASSERT_EQ(run("auto", "auto", /*stop_after=*/29), 0);
    EXPECT_EQ(list_checkpoints(cfg.out_dir).back().step, 29);
    ASSERT_EQ(run("auto", "auto"), 0);
    EXPECT_EQ(list_checkpoints(cfg.out_dir).back().step, 40);
    const auto lines = deterministic(metrics("auto"));
    EXPECT_EQ(lines, deterministic(metrics("straight")));
    ASSERT_EQ(run("auto", "auto"), 0);  // done: no step left, and nothing written
    EXPECT_EQ(deterministic(metrics("auto")), lines);
}

// The outlier guard's windows travel in the checkpoint. With a threshold that ordinary steps trip
// (a loss above the mean of the last 4), the run is split just before a skipped step: the resumed
// run skips it too (fresh windows would not be full yet) and every line equals the straight run's.
TEST_F(CheckpointTest, ResumedRunKeepsTheOutlierWindows) {
    cfg.outlier_window = 4;
    cfg.skip_loss_z = 1e-9;
    cfg.ckpt_every = 40;
    ASSERT_EQ(run("straight"), 0);
    const auto a = deterministic(metrics("straight"));
    int skipped = 0;
    for (const json& j : a)
        if (j.contains("skipped") && j["step"].get<int>() > cfg.outlier_window + 1) {
            skipped = j["step"].get<int>();
            break;
        }
    ASSERT_GT(skipped, 0) << "no step tripped the guard";
    ASSERT_EQ(run("split", "", /*stop_after=*/skipped - 1), 0);
    const Checkpoint mid = load_checkpoint(checkpoint_path(cfg.out_dir, skipped - 1));
    EXPECT_EQ(mid.loss_window.size(), 4u);
    EXPECT_EQ(mid.grad_norm_window.size(), 4u);
    ASSERT_EQ(run("split", "latest"), 0);
    EXPECT_EQ(a, deterministic(metrics("split")));
}

TEST_F(CheckpointTest, SigintFinishesTheStepSavesAndResumesExactly) {
    cfg.steps = 100000;  // far more than the signal lets run
    cfg.eval_every = 0;
    const fs::path log = dir / "signalled" / "metrics.jsonl";
    auto loss_lines = [](const fs::path& p) {
        std::ifstream f(p);
        int n = 0;
        for (std::string line; std::getline(f, line);) n += line.find("\"loss\"") != std::string::npos;
        return n;
    };
    // Once a few steps are logged (the handlers are installed before the first step), a real
    // SIGINT to this process, as Ctrl-C would send.
    std::atomic<bool> sent{false};
    std::thread interrupter([&] {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
        while (loss_lines(log) < 3 && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        sent = true;
        ::kill(::getpid(), SIGINT);
    });
    const int rc = run("signalled");
    interrupter.join();
    ASSERT_TRUE(sent);
    EXPECT_EQ(rc, 0);
    const int stopped_at = loss_lines(log);
    const auto saved = list_checkpoints((dir / "signalled").string());
    ASSERT_EQ(saved.size(), 1u);
    EXPECT_EQ(saved[0].step, stopped_at);  // the step under way finished, logged, and was saved

    const int end = stopped_at + 4;
    ASSERT_EQ(run("signalled", "latest", end), 0);
    ASSERT_EQ(run("straight", "", end), 0);
    EXPECT_EQ(deterministic(metrics("signalled")), deterministic(metrics("straight")));
    expect_same_state(load_checkpoint(checkpoint_path((dir / "signalled").string(), end)).state,
                      load_checkpoint(checkpoint_path((dir / "straight").string(), end)).state);
}

TEST_F(CheckpointTest, KeepsTheNewestK) {
    cfg.steps = 10;
    cfg.ckpt_every = 2;
    cfg.ckpt_keep = 2;
    ASSERT_EQ(run("keep"), 0);
    const auto left = list_checkpoints(cfg.out_dir);
    ASSERT_EQ(left.size(), 2u);
    EXPECT_EQ(left[0].step, 8);
    EXPECT_EQ(left[1].step, 10);
    EXPECT_EQ(latest_checkpoint(cfg.out_dir), checkpoint_path(cfg.out_dir, 10));

    // Checkpoints of later steps (a run that went further, then was resumed from an earlier one)
    // are not the older ones: they stay until this run replaces them.
    write_bytes(fs::path(cfg.out_dir) / "ckpt_99.bin", "x");
    write_bytes(fs::path(cfg.out_dir) / "ckpt_x.bin", "x");  // not a checkpoint name
    prune_checkpoints(cfg.out_dir, 10, 1);
    const auto now = list_checkpoints(cfg.out_dir);
    ASSERT_EQ(now.size(), 2u);
    EXPECT_EQ(now[0].step, 10);
    EXPECT_EQ(now[1].step, 99);
    EXPECT_TRUE(fs::exists(fs::path(cfg.out_dir) / "ckpt_x.bin"));
}

TEST_F(CheckpointTest, CorruptFilesAreRefusedWithOneLineNamingTheProblem) {
    const fs::path good = dir / "good.bin";
    save_checkpoint(good.string(), trained_checkpoint(2));
    const std::string file = read_bytes(good);
    const Parts parts = split(file);
    const size_t start = file.size() - 4 - parts.data.size();
    const fs::path bad = dir / "bad.bin";
    auto refusal = [&](const std::string& bytes) {
        write_bytes(bad, bytes);
        return error_of([&] { load_checkpoint(bad.string()); });
    };
    auto expect_refused = [&](const std::string& bytes, const std::string& want, const std::string& what) {
        const std::string msg = refusal(bytes);
        EXPECT_NE(msg.find(want), std::string::npos) << what << ": " << msg;
        EXPECT_NE(msg.find(bad.string()), std::string::npos) << what << ": " << msg;
        EXPECT_EQ(msg.find('\n'), std::string::npos) << what << ": " << msg;
    };
    ASSERT_NO_THROW(load_checkpoint(good.string()));

    std::string b = file;
    b[0] = 'X';
    expect_refused(b, "not a codagpt checkpoint (bad magic)", "magic");
    expect_refused(read_bytes(fs::path(CODAGPT_SOURCE_DIR) / "configs" / "gpt2-tiny.json"), "bad magic", "a config");
    b = file;
    b[8] = 2;
    expect_refused(b, "unsupported checkpoint format version 2 (this build reads 1)", "version");

    for (size_t cut : {size_t(0), size_t(5), size_t(8), size_t(20), size_t(24), size_t(100), start, start + 1000,
                       file.size() - 5, file.size() - 1})
        expect_refused(file.substr(0, cut), "truncated", "cut at " + std::to_string(cut));
    expect_refused(file + "x", "1 unexpected bytes after the checksum", "a trailing byte");

    for (size_t at : {start, start + parts.data.size() / 2, file.size() - 5, file.size() - 1, size_t(40)}) {
        b = file;
        b[at] ^= 0x10;  // in the data, in the CRC itself, and in the metadata text
        expect_refused(b, "checksum mismatch", "byte " + std::to_string(at) + " flipped");
    }

    // Intact files (valid checksum) whose tensor table does not fit their own config.
    Parts p = parts;
    p.meta["tensors"][3]["name"] = "param.ln1_x";
    expect_refused(join(p), "tensor table: entry 3 is 'param.ln1_x', expected 'param.ln1_b'", "renamed");
    p = parts;
    p.meta["tensors"][1]["size"] = p.meta["tensors"][1]["size"].get<uint64_t>() + 4;
    expect_refused(join(p), "tensor table: param.wpe is", "resized");
    p = parts;
    p.meta["tensors"].erase(p.meta["tensors"].size() - 1);
    expect_refused(join(p), "tensor table: adam_v.lnf_b is missing", "dropped");
    p = parts;
    p.meta["tensors"][0]["dtype"] = "bf16";
    expect_refused(join(p), "tensor table: param.wte has dtype \"bf16\"", "dtype");
    p = parts;
    p.meta["config"]["n_layer"] = 2;  // a table for one layer under a config of two
    expect_refused(join(p), "tensor table", "config of another shape");
    p = parts;
    p.meta.erase("step");
    expect_refused(join(p), "step", "no step");
    p = parts;
    p.meta["outlier_windows"]["loss"] = json::array({1.5, "x"});
    expect_refused(join(p), "outlier_windows.loss holds a string, not a finite number", "a word in a window");
    p = parts;
    p.meta["outlier_windows"]["grad_norm"] = 3;
    expect_refused(join(p), "outlier_windows.grad_norm is not an array", "a window not an array");
    p = parts;
    p.meta["outlier_windows"].erase("loss");
    expect_refused(join(p), "outlier_windows.loss is not an array", "a window missing");
    p = parts;
    p.meta["outlier_windows"] = 3;
    expect_refused(join(p), "outlier_windows is not an object", "windows not an object");
    p = parts;
    p.meta.erase("outlier_windows");  // files from before the outlier guard
    EXPECT_EQ(refusal(join(p)), "(no error)");
    EXPECT_EQ(refusal(join(parts)), "(no error)");  // the rebuilding itself is faithful
}

TEST_F(CheckpointTest, OtherShapeVocabOrDataOrderIsRefusedNamingTheKey) {
    const fs::path path = dir / "ckpt_5.bin";
    save_checkpoint(path.string(), trained_checkpoint(5));
    const Checkpoint ck = load_checkpoint(path.string());
    auto refusal = [&](auto change) {
        TrainConfig other = cfg;
        change(other);
        return error_of([&] { check_resumable(ck, other, path.string()); });
    };
    EXPECT_EQ(refusal([](TrainConfig&) {}), "(no error)");
    EXPECT_EQ(refusal([](TrainConfig& c) { c.steps = 80, c.lr = 3e-3, c.eval_every = 7; }), "(no error)");
    const std::string where = "checkpoint " + path.string() + ": ";
    EXPECT_EQ(refusal([](TrainConfig& c) { c.model.n_layer = 2; }),
              where + "n_layer is 1 in the checkpoint but 2 in this run's config (another model shape)");
    EXPECT_EQ(refusal([](TrainConfig& c) { c.model.n_embd = 64; }),
              where + "n_embd is 32 in the checkpoint but 64 in this run's config (another model shape)");
    EXPECT_EQ(refusal([](TrainConfig& c) { c.model.n_head = 4; }),
              where + "n_head is 2 in the checkpoint but 4 in this run's config (another model shape)");
    EXPECT_EQ(refusal([](TrainConfig& c) { c.model.max_seq_len = 32; }),
              where + "max_seq_len is 16 in the checkpoint but 32 in this run's config (another model shape)");
    EXPECT_EQ(refusal([](TrainConfig& c) { c.model.vocab_size = 50257; }),
              where + "vocab_size is 256 in the checkpoint but 50257 in this run's config (another vocabulary)");
    EXPECT_EQ(refusal([](TrainConfig& c) { c.batch_size = 8; }),
              where + "batch_size is 4 in the checkpoint but 8 in this run's config (another data order)");
    EXPECT_EQ(refusal([](TrainConfig& c) { c.steps = 4; }),
              where + "it is at step 5, beyond this run's steps (4)");
}

TEST_F(CheckpointTest, RefusedResumeOverwritesNothing) {
    cfg.steps = 4;
    cfg.ckpt_every = 4;
    ASSERT_EQ(run("r"), 0);
    const fs::path out = dir / "r";
    const std::string metrics_before = read_bytes(out / "metrics.jsonl");
    const std::string config_before = read_bytes(out / "config.json");
    const std::string ckpt = checkpoint_path(out.string(), 4);
    const std::string ckpt_before = read_bytes(ckpt);
    std::string corrupt = ckpt_before;
    corrupt[corrupt.size() / 2] ^= 1;
    write_bytes(dir / "corrupt.bin", corrupt);

    auto expect_refused = [&](const std::string& resume, const std::string& want, int stop_after = 0) {
        const std::string msg = error_of([&] { run("r", resume, stop_after); });
        EXPECT_NE(msg.find(want), std::string::npos) << msg;
        EXPECT_EQ(read_bytes(out / "metrics.jsonl"), metrics_before);
        EXPECT_EQ(read_bytes(out / "config.json"), config_before);
        EXPECT_EQ(read_bytes(ckpt), ckpt_before);
        EXPECT_EQ(list_checkpoints(out.string()).size(), 1u);
    };
    expect_refused((dir / "corrupt.bin").string(), "checksum mismatch");
    expect_refused((dir / "missing.bin").string(), "cannot open checkpoint");
    cfg.steps = 8;
    cfg.model.n_embd = 64;
    expect_refused("latest", "n_embd is 32 in the checkpoint but 64");
    cfg.model.n_embd = 32;
    expect_refused("latest", "--stop-after 4 is not after step 4, where", /*stop_after=*/4);
    cfg.steps = 2;
    expect_refused("latest", "beyond this run's steps (2)");
    cfg.out_dir = (dir / "empty").string();
    EXPECT_NE(error_of([&] { run("empty", "latest"); }).find("no checkpoint ckpt_<step>.bin in"), std::string::npos);
}

// The checkpoints in out_dir are the run's own past: a new run there, or one resumed from a
// checkpoint kept elsewhere, is refused; a run resumed from an earlier checkpoint of the folder
// moves the later ones aside, so that --resume latest then finds its own and not the abandoned ones.
TEST_F(CheckpointTest, OutDirHoldsOneRunsCheckpoints) {
    cfg.steps = 8;
    cfg.ckpt_every = 2;
    cfg.ckpt_keep = 2;
    ASSERT_EQ(run("a"), 0);
    const std::string a = (dir / "a").string();
    const std::string a8 = checkpoint_path(a, 8), a8_bytes = read_bytes(a8);
    EXPECT_NE(error_of([&] { run("a"); }).find("holds the checkpoints of an earlier run (newest ckpt_8.bin)"),
              std::string::npos);
    ASSERT_EQ(run("b"), 0);
    EXPECT_NE(error_of([&] { run("b", a8); }).find("holds the checkpoints of another run (newest ckpt_8.bin)"),
              std::string::npos);
    fs::create_directories(dir / "log_only");
    write_bytes(dir / "log_only" / "metrics.jsonl", "{\"step\": 1, \"loss\": 5.0}\n");
    EXPECT_NE(error_of([&] { run("log_only", a8); }).find("holds the log of another run (metrics.jsonl)"),
              std::string::npos);
    EXPECT_EQ(read_bytes(dir / "log_only" / "metrics.jsonl"), "{\"step\": 1, \"loss\": 5.0}\n");

    // Branch off at step 6 and stop at 7: ckpt_8 of the abandoned steps goes aside, whole.
    ASSERT_EQ(run("a", checkpoint_path(a, 6), /*stop_after=*/7), 0);
    EXPECT_EQ(latest_checkpoint(a), checkpoint_path(a, 7));
    EXPECT_FALSE(fs::exists(a8));
    EXPECT_EQ(read_bytes(a8 + ".superseded"), a8_bytes);
    // ... and the run continues from its own step 7, to the same weights as a run that went on from
    // step 6 without stopping.
    ASSERT_EQ(run("c", checkpoint_path(a, 6)), 0);
    ASSERT_EQ(run("a", "latest"), 0);
    const Checkpoint branched = load_checkpoint(a8), straight = load_checkpoint(checkpoint_path((dir / "c").string(), 8));
    EXPECT_TRUE(same_bits(branched.state.params, straight.state.params));
}

// A resume with another grad_accum (or rank count) whose share of an epoch is shorter than the
// position the first run had reached: the run goes on with the next epoch instead of refusing it.
TEST_F(CheckpointTest, ResumesWithAnotherGradAccumInAnEpochsTail) {
    cfg.steps = 20;
    cfg.ckpt_every = 20;
    cfg.grad_accum = 2;
    ASSERT_EQ(run("g", "", /*stop_after=*/15), 0);  // 30 of the 31 windows of epoch 0 taken
    cfg.grad_accum = 4;                             // a share of 28 windows an epoch
    ASSERT_EQ(run("g", "latest"), 0);
    const Checkpoint end = load_checkpoint(checkpoint_path((dir / "g").string(), 20));
    EXPECT_EQ(end.train_loader.epoch, 1u);
    EXPECT_EQ(end.train_loader.next, 5u * 4);  // steps 16 ... 20, from the start of epoch 1
}

TEST_F(CheckpointTest, AFailedOrCrashedWriteLeavesThePreviousCheckpoint) {
    const fs::path out = dir / "w";
    fs::create_directories(out);
    const std::string path = checkpoint_path(out.string(), 5);
    const Checkpoint first = trained_checkpoint(5);
    save_checkpoint(path, first);
    const std::string before = read_bytes(path);
    Checkpoint second = trained_checkpoint(6);
    second.step = 5;  // the same name: a rewrite of ckpt_5.bin that fails half-way

    // A write that fails (disk full, I/O error) half-way: the temporary file goes, the old file stays.
    size_t total = 0;
    write_checkpoint(second, [&](const void*, size_t k) { total += k; });
    EXPECT_EQ(total, before.size());
    const std::string msg = error_of([&] {
        AtomicFileWriter w(path);
        write_checkpoint(second, [&](const void* p, size_t k) {
            if (w.bytes_written() + k > total / 2) throw Error("no space left on device (simulated)");
            w.write(p, k);
        });
        w.commit();
    });
    EXPECT_EQ(msg, "no space left on device (simulated)");
    EXPECT_EQ(read_bytes(path), before);
    EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()), 1);

    // A process killed half-way through save_checkpoint: its temporary file may stay behind, but
    // the checkpoint is intact, and `latest` and pruning see only finished checkpoints.
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        AtomicFileWriter w(path);
        write_checkpoint(second, [&](const void* p, size_t k) {
            if (w.bytes_written() + k > total / 2) ::_exit(3);  // dies with the file half-written
            w.write(p, k);
        });
        ::_exit(0);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 3);
    EXPECT_EQ(std::distance(fs::directory_iterator(out), fs::directory_iterator()), 2);  // + the temporary
    EXPECT_EQ(read_bytes(path), before);
    const Checkpoint back = load_checkpoint(latest_checkpoint(out.string()));
    expect_same_state(back.state, first.state);
    EXPECT_EQ(list_checkpoints(out.string()).size(), 1u);

    // The next checkpoint's pruning deletes the dead writer's temporary file, as large as a
    // checkpoint; a write still in flight (here this process's own) and other names stay.
    const std::string dead_temp = path + ".tmp." + std::to_string(child);
    ASSERT_TRUE(fs::exists(dead_temp));
    AtomicFileWriter live(checkpoint_path(out.string(), 6));
    live.write("x", 1);
    write_bytes(out / "ckpt_5.bin.tmp.notapid", "x");
    const std::string other_dead_temp = "notes.bin.tmp." + std::to_string(child);  // not a checkpoint's
    write_bytes(out / other_dead_temp, "x");
    prune_checkpoints(out.string(), 5, 1);
    EXPECT_FALSE(fs::exists(dead_temp));
    EXPECT_TRUE(fs::exists(live.temp_path()));
    EXPECT_TRUE(fs::exists(out / "ckpt_5.bin.tmp.notapid"));
    EXPECT_TRUE(fs::exists(out / other_dead_temp));
    EXPECT_EQ(read_bytes(path), before);
}

// Checkpoints: everything a run needs to continue bit for bit, in one file out_dir/ckpt_<step>.bin.
//
// Layout, integers little-endian:
//   offset 0    8 bytes  magic "CODAGPTC"
//          8    uint32   format version (kCheckpointVersion)
//          12   uint32   M: bytes of metadata
//          16   uint64   D: bytes of tensor data
//          24   M bytes  metadata, one JSON object (below), then zeros up to P = 24 + M rounded up to 64
//          P    D bytes  tensor data: fp32 little-endian, where the tensor table puts it
//          P+D  uint32   CRC-32 (IEEE, as zlib's crc32) of every byte before it
// Metadata: {"format": "codagpt checkpoint", "config": the run's config (every key, as config.json),
//   "step": optimizer steps completed, "adamw_t": AdamW updates taken (bias correction),
//   "train_loader": {"epoch", "next", "ranks"} (DataLoader::State of each of `ranks` data-parallel
//   ranks; files without "ranks" are of one), "outlier_windows": {"loss": [...], "grad_norm": [...]}
//   (the outlier guard's last values, oldest first; absent in older files), "bad_steps_in_a_row"
//   (non-finite steps skipped just before it; absent in older files), "tensors": [{"name",
//   "dtype": "f32", "offset", "size"}, ...]} with offset (from P) and size in bytes. The tensors are param.<name>
//   (fp32 weights of record), then adam_m.<name>, then adam_v.<name>, each over param_layout(),
//   contiguous. No random-generator state is needed: initialisation is a function of the seed, the
//   data order a function of (seed, epoch), and the step itself draws nothing.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backend.hpp"
#include "config.hpp"
#include "data.hpp"

namespace codagpt {

constexpr char kCheckpointMagic[8] = {'C', 'O', 'D', 'A', 'G', 'P', 'T', 'C'};
constexpr uint32_t kCheckpointVersion = 1;
constexpr size_t kCheckpointHeaderBytes = 24;  // magic, version, M, D
constexpr size_t kCheckpointAlign = 64;        // the tensor data starts at a multiple of this

struct Checkpoint {
    TrainConfig config;  // of the run that wrote it
    int step = 0;        // optimizer steps completed: the run continues with step index `step`
    DataLoader::State train_loader;  // every rank's (they move in lockstep)
    TrainState state;                // full, whatever the rank count (a ZeRO-1 run gathers it to rank 0)
    int data_ranks = 1;              // the ranks of the run that wrote it
    // The outlier guard's windows (outlier_window.hpp): the last losses and gradient norms, oldest
    // first; empty in files written before they were kept.
    std::vector<double> loss_window, grad_norm_window;
    // Steps skipped in a row just before it (max_bad_steps counts on across a resume); 0 in files
    // written before it was kept.
    int bad_steps_in_a_row = 0;
};

// Writes `ck` to `path` atomically (temporary file, fsync, rename): a crash or an error at any
// point leaves an existing `path` as it was. Throws Error on I/O failure.
void save_checkpoint(const std::string& path, const Checkpoint& ck);
// The file's bytes, in order, handed to `sink` (save_checkpoint's sink is an AtomicFileWriter).
void write_checkpoint(const Checkpoint& ck, const std::function<void(const void*, size_t)>& sink);
// Reads and checks a checkpoint: a missing file, bad magic, another version, a truncated file,
// a checksum mismatch and a tensor table that does not fit its own config throw Error naming the
// file and the problem.
Checkpoint load_checkpoint(const std::string& path);
// Refuses (Error naming the key and both values) a checkpoint that cannot continue `cfg`: another
// model shape or vocabulary, another data order (batch_size, seq_len, shuffle, seed), or a step
// beyond cfg.steps. Other keys (steps, lr, eval cadence, paths, ...) may change on resume.
void check_resumable(const Checkpoint& ck, const TrainConfig& cfg, const std::string& path);

// The data position of `ck` for a run on `ranks` ranks of `micro_steps` micro-batches a step, whose
// share of an epoch is `windows_per_rank` (resuming on another rank count or grad_accum): the same
// epoch, and the windows the writing run's ranks had taken (data_ranks x next positions of the
// epoch's order) shared out again, each rank continuing after its share, rounded down to a whole
// optimizer step (when the counts do not divide, a few windows are seen twice); a position past
// the new share (the writing run was in the tail of the epoch that this split leaves out) is the
// epoch's end. The same ranks and micro-batches keep the position.
DataLoader::State loader_state_for(const Checkpoint& ck, int ranks, int micro_steps, uint64_t windows_per_rank);
// out_dir/ckpt_<step>.bin
std::string checkpoint_path(const std::string& out_dir, int step);
// The checkpoints in out_dir (files named exactly ckpt_<step>.bin), ordered by step.
struct CheckpointFile {
    int step;
    std::string path;
};
std::vector<CheckpointFile> list_checkpoints(const std::string& out_dir);
// The one with the highest step; throws Error when out_dir has none.
std::string latest_checkpoint(const std::string& out_dir);
// The checkpoints in out_dir are one run's: a run prunes them, and `--resume latest` picks the
// newest. Refuses (Error) a new run (no resume_step) into a folder holding checkpoints, and a run
// resumed from a checkpoint outside it (resume_path none of them) into one holding checkpoints or
// the run log `log`. Returns the checkpoints after the one resumed from: steps the run redoes,
// which it sets aside when it starts. Reads only.
std::vector<CheckpointFile> check_run_folder(const std::string& out_dir, const std::string& log,
                                             const std::string& resume_path, std::optional<int> resume_step);
// Renames checkpoint `path` to `path`.superseded (.superseded.2, .3, ... where taken), a name that
// list_checkpoints and the pruning pass over, and returns the new path; Error where it cannot.
std::string set_aside(const std::string& path);
// Keeps the newest `keep` checkpoints of steps <= `step` (the one just written among them) and
// deletes the older ones (later ones are none of this run's: check_run_folder had them set aside).
// Also deletes the temporary files of checkpoint writes (ckpt_<step>.bin.tmp.<pid>) whose writer no
// longer runs on this host: a process killed mid-write leaves one, as large as a checkpoint.
void prune_checkpoints(const std::string& out_dir, int step, int keep);

// CRC-32 (IEEE 802.3 polynomial, reflected; zlib's crc32), continued from `crc`.
uint32_t crc32(const void* data, size_t n, uint32_t crc = 0);

}  // namespace codagpt

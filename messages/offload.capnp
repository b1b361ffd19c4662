# Wire schema between trainers and offload services (see messages/README.md).
#
# Every ZeroMQ message is [header] or [header, payload]: the header is one `Header`
# (flat-array encoded), the payload the raw tensor bytes, never copied into a builder. A
# fetchReply's payload may instead come as several frames, [header, part, part, ...], when
# its request asked for that (FetchParameters.replyPartBytes).
# Only messages/codec.cpp reads or writes these types; everything else uses the plain
# C++ structs of messages/codec.h.
#
# Evolution rules: add fields / union members only at the end with the next ordinal;
# bump `schemaVersion` when a change alters the meaning of an existing field (a
# receiver rejects any other version instead of guessing).

@0xfb6b1d226c15016e;

using Cxx = import "/capnp/c++.capnp";
$Cxx.namespace("dsactor::messages::wire");

const schemaVersion :UInt16 = 1;

# Element types of payloads and partitions. `invalid` is ordinal 0 so that an unset
# field decodes as invalid and is rejected, never silently taken as fp32.
enum DType {
  invalid @0;
  fp32 @1;
  bf16 @2;
  fp16 @3;
}

enum OptimizerKind {
  adam @0;
  adamw @1;
}

enum ErrorCode {
  malformed @0;          # header/frames do not parse or contradict themselves
  unknownPartition @1;   # partition id not registered on this service
  versionOrder @2;       # stale/duplicate step or micro-step, version not reachable
  checksumMismatch @3;   # payload crc32c differs from the header's
  tooLarge @4;           # payload or header above the receiver's limits
  outOfMemory @5;        # the service cannot place the partition (RAM/NVMe full)
  notImplemented @6;     # known kind the receiver does not serve
  internal @7;           # bug or I/O failure on the receiver
  schemaMismatch @8;     # header.schemaVersion differs from the receiver's
  permissionDenied @9;   # the job belongs to another client key (the reply names nothing of it)
  busy @10;              # too many requests of this client in flight: retry after a pause
}

struct OptimizerConfig {
  kind @0 :OptimizerKind;
  lr @1 :Float64;
  beta1 @2 :Float64 = 0.9;
  beta2 @3 :Float64 = 0.999;
  eps @4 :Float64 = 1e-8;
  weightDecay @5 :Float64;
  biasCorrection @6 :Bool = true;
}

struct PartitionSpec {
  partitionId @0 :UInt64;
  elementCount @1 :UInt64;
  masterDtype @2 :DType;     # what the service keeps (normally fp32)
  servedDtype @3 :DType;     # what FetchParameters returns by default
  optimizer @4 :OptimizerConfig;
}

struct PartitionVersion {
  partitionId @0 :UInt64;
  version @1 :UInt64;        # step number of the last committed update
}

# ---- requests (trainer -> service) and their replies (service -> trainer) ----

struct Register {
  rank @0 :UInt32;
  worldSize @1 :UInt32;
  partitions @2 :List(PartitionSpec);
  # A restarted trainer continuing the job: gradients an earlier session pushed for the
  # job's next step (it died before committing) are discarded, the step stays.
  resume @3 :Bool;
}

struct RegisterReply {
  serviceId @0 :Text;
  partitions @1 :List(PartitionVersion);   # current versions (non-zero after a restore)
  # The job's last step committed or skipped here, the resume record the trainer sent with
  # it (empty: none), and whether both survive a restart of the service (NVMe + RocksDB).
  step @2 :UInt64;
  resumeRecord @3 :Data;
  durable @4 :Bool;
}

# Payload: elementCount values of dtype (the partition's initial parameters).
struct SetParameters {
  partitionId @0 :UInt64;
  version @1 :UInt64;
  dtype @2 :DType;
  elementCount @3 :UInt64;
}

struct SetParametersReply {
  partitionId @0 :UInt64;
  version @1 :UInt64;
}

# Payload: elementCount gradient values of dtype for one partition.
struct PushGradients {
  partitionId @0 :UInt64;
  step @1 :UInt64;
  microStep @2 :UInt32;
  dtype @3 :DType;
  elementCount @4 :UInt64;
  # Set: the gradient bytes are this region of a mapped arena, not a payload frame (the
  # message is one frame; header payloadLength and payloadCrc32c are 0).
  arena @5 :ArenaSlice;
  # rangeCount > 0: the payload is elements [rangeOffset, rangeOffset + rangeCount) of the
  # partition's elementCount, one of the ranges a micro-step-0 push is split into, sent in
  # order (offset 0 first) so the service adds each while the next is on the wire.
  rangeOffset @6 :UInt64;
  rangeCount @7 :UInt64;
  # Set: the service may keep `arena` as the partition's gradient instead of copying it out
  # (it does for a whole fp32 micro-step-0 push into a RAM partition with crcOmitted, and
  # says so in PushReply.kept). A kept slice is the service's until the step's CommitReply
  # or the SkipStep's reply: the step's Adam pass reads the gradient there, and a commit
  # answered after the update (CommitReply.keptHoldParameters) leaves the partition's
  # updated fp32 parameters in it, the next step's fetch of it already done.
  keepUntilCommit @8 :Bool;
  # Set (updateLr the step's learning rate): the trainer asks for the optimizer step in the
  # push, as PyTorch's optimizer-in-backward does: the service runs the partition's Adam
  # pass on this gradient now (Adam's t the partition's next, no clipping, loss scale 1)
  # instead of keeping it for the commit, and says so in PushReply.updated. It does so for
  # an fp32 micro-step-0 push into a RAM partition (in ranges: at the last), whatever the
  # gradient holds (the reply's stats come from the same pass). The step is then partly
  # applied until its commit: no fetch of the partition is served, and it can be neither
  # skipped nor resumed.
  updateAtPush @9 :Bool;
  updateLr @10 :Float64;
  # Set: the sender's own stats of this gradient (the sum of squares of its elementCount
  # floats as the kernels' grad_stats adds them, and whether any is inf or nan), with its
  # word that no element is -0. A trainer takes them where its backward left the gradient,
  # still in its cache. A service that keeps the arena slice (PushReply.kept) answers with
  # these instead of reading the gradient for them; one that copies the push computes its
  # own. They feed only the sender's job's norm and overflow vote, which the trainer
  # decides anyway.
  givenStats @11 :PushedStats;
}

struct PushedStats {
  sumSquares @0 :Float64;    # >= 0; +inf or nan exactly when nonfinite
  nonfinite @1 :Bool;
}

struct PushReply {
  partitionId @0 :UInt64;
  step @1 :UInt64;
  microStep @2 :UInt32;
  sumSquares @3 :Float64;    # of the (unscaled) accumulated gradient partition
  nonfinite @4 :Bool;        # any inf/nan seen
  kept @5 :Bool;             # the push's arena slice is kept (PushGradients.keepUntilCommit)
  updated @6 :Bool;          # the partition's Adam step ran on this push (updateAtPush)
}

struct CommitStep {
  step @0 :UInt64;
  clipCoef @1 :Float64;
  lossScale @2 :Float64;
  lr @3 :Float64;
  # What the trainer needs to continue after this step (data position, loss scaler,
  # counters): opaque to the service, at most Limits::max_record_bytes, stored in the same
  # metadata batch as the step and handed back in RegisterReply.
  resumeRecord @4 :Data;
  # Answer only once every partition of the step is updated, instead of once the step is
  # decided and durable with the update published block by block behind the reply: for a
  # trainer that computes on the cores the service's update would otherwise share.
  publishBeforeReply @5 :Bool;
}

struct SkipStep {
  step @0 :UInt64;
  resumeRecord @1 :Data;     # as CommitStep.resumeRecord
}

struct CommitReply {
  step @0 :UInt64;
  applied @1 :Bool;                        # false for a skipped step
  partitions @2 :List(PartitionVersion);
  # Every arena slice this step's pushes left kept now holds its partition's fp32
  # parameters at `step` (the commit was answered after the update). Unset: a kept slice's
  # bytes are not parameters, and it is the trainer's again.
  keptHoldParameters @3 :Bool;
  # Answered after the update: the master view (FetchReply.masterView) each RAM partition's
  # fp32 parameters at `step` are in now. A trainer holding that view reads them there
  # until its next commit, asking nothing; one holding another view id (the master was
  # copied on write since) fetches again. Empty for a commit answered before the update.
  currentViews @4 :List(CurrentView);
}

struct CurrentView {
  partitionId @0 :UInt64;
  viewId @1 :UInt64;
}

struct FetchParameters {
  partitionId @0 :UInt64;
  minVersion @1 :UInt64;
  dtype @2 :DType;
  # Set: write the values into this region of a mapped arena (length = its capacity,
  # crc32c 0) and answer with FetchReply.arena instead of a payload frame.
  arena @3 :ArenaSlice;
  # 0: a frame reply's payload is one frame. Else it comes as frames of this many bytes
  # (the last one shorter), a multiple of 8 and at least 4096; the header's payloadLength
  # and payloadCrc32c cover the parts joined in order. The receiver's allocator serves
  # each part from memory it keeps, where one large frame would be fresh pages
  # (messages/frame_heap.h).
  replyPartBytes @4 :UInt64;
  # rangeCount > 0: only elements [rangeOffset, rangeOffset + rangeCount) of the
  # partition, one of the ranges a fetch over frames is split into and pipelined, so each
  # range is copied out while the next is on the wire. 0: the whole partition (rangeOffset
  # 0). A range past the partition's end is refused (badRequest).
  rangeOffset @5 :UInt64;
  rangeCount @6 :UInt64;
  # Set (fp32, the whole partition, arena set): the requester on this host would rather map
  # the partition's master read-only than have it copied into its arena
  # (FetchReply.masterView). heldView: the view it has mapped for the partition (0: none),
  # so a reply that names the same one carries no ticket.
  acceptMasterView @7 :Bool;
  heldView @8 :UInt64;
}

# Payload: elementCount values of dtype.
struct FetchReply {
  partitionId @0 :UInt64;
  version @1 :UInt64;
  dtype @2 :DType;
  elementCount @3 :UInt64;
  # Set: the values were written to this region of the arena the request named (one
  # frame; header payloadLength and payloadCrc32c are 0).
  arena @4 :ArenaSlice;
  # As the request's: the payload is elements [rangeOffset, rangeOffset + rangeCount) of
  # the partition's elementCount (rangeCount 0: all of them).
  rangeOffset @5 :UInt64;
  rangeCount @6 :UInt64;
  # Set: no bytes were written or sent; the values are elements [0, elementCount) of the
  # partition's master, to be read from a read-only view of it (one frame, no payload).
  masterView @7 :MasterView;
}

# A RAM-tier partition's fp32 master as the service holds it: a sealed memfd the requester
# maps read-only (MAP_SHARED), fetched once per viewId from the Unix socket (SCM_RIGHTS)
# with the one-time ticket. Valid until the next step's commit for the partition.
struct MasterView {
  viewId @0 :UInt64;         # never 0; a new one whenever the partition's memory changes
  ticket @1 :Text;           # empty: the requester's heldView is this one
  socket @2 :Text;           # "@name": the Unix socket (abstract namespace)
}

struct Stats {}

struct StatsReply {
  bytesInRam @0 :UInt64;
  bytesOnNvme @1 :UInt64;
  partitions @2 :UInt64;
  steps @3 :UInt64;
  # How the RAM tier is pinned: "cudaHostAlloc", "mlock" or "none" (offload_service/host_memory.h).
  pinning @4 :Text;
  partitionsInRam @5 :UInt64;
  partitionsOnNvme @6 :UInt64;
  # Whether the service has an NVMe tier (`--nvme DIR`) and its directory. A service older
  # than these fields sends neither, which reads as `unknown`.
  nvmeTier @7 :NvmeTier;
  nvmeDir @8 :Text;
}

enum NvmeTier {
  unknown @0;
  absent @1;
  present @2;
}

# Where a checkpoint lives: `name`, a relative path the service resolves beneath its state
# directory, in the directory of the requester's key and job. `path` (an absolute path on
# the service's host, before `name` existed) is refused.
struct Checkpoint {
  tag @0 :Text;
  path @1 :Text;
  name @2 :Text;
}

struct CheckpointReply {
  tag @0 :Text;
  step @1 :UInt64;
  bytesWritten @2 :UInt64;
  location @3 :Text;         # the directory written, on the service's host (for people)
}

struct Restore {
  tag @0 :Text;
  path @1 :Text;             # refused, as Checkpoint.path
  name @2 :Text;
}

struct RestoreReply {
  tag @0 :Text;
  step @1 :UInt64;
  partitions @2 :List(PartitionVersion);
}

struct Ping {
  nonce @0 :UInt64;
}

# Answered by the service's gateway itself, never queued behind the job's work: that the
# service is alive, and how far the operation in flight on the header's job (of the
# requester's key) has got: "" when none, else e.g. "commit" of `step`, `done` of `total`
# partitions, running for `elapsedMs`.
struct Pong {
  nonce @0 :UInt64;
  operation @1 :Text;
  step @2 :UInt64;
  done @3 :UInt64;
  total @4 :UInt64;
  elapsedMs @5 :UInt64;
}

# ---- same-host shared memory (messages/README.md, "Shared-memory arena") ----

# A byte range of an arena that stands in for a payload frame.
struct ArenaSlice {
  arenaId @0 :UInt64;        # from MapArenaReply; 0 names no arena
  offset @1 :UInt64;
  length @2 :UInt64;         # bytes
  crc32c @3 :UInt32;         # CRC-32C of the bytes (0 in FetchParameters)
  # Set: the sender computed no CRC-32C (crc32c is 0) and the receiver checks none. In
  # FetchParameters: the requester will not check the reply's, so the service need not
  # compute one.
  crcOmitted @4 :Bool;
}

# Maps the requester's arena (a sealed memfd of `size` bytes) in two steps: without
# `ticket`, the service answers with a one-time ticket and the Unix socket to hand the fd
# over (SCM_RIGHTS); with the ticket, once the fd is handed over, it maps it and answers
# with the arena's id. `path` (a /proc/<pid>/fd/<fd> the service opened, before tickets
# existed) is refused.
struct MapArena {
  path @0 :Text;
  size @1 :UInt64;
  ticket @2 :Text;
}

struct MapArenaReply {
  arenaId @0 :UInt64;        # 0 in the answer that carries a ticket
  size @1 :UInt64;
  ticket @2 :Text;
  socket @3 :Text;           # the Unix socket ("@name": abstract namespace)
  # In the answer that names the arena: the service took the request channel handed over
  # with the fd (one end of a SOCK_SEQPACKET socketpair) and reads the job's arena pushes
  # there, each datagram one request's header, answered on it.
  channel @4 :Bool;
}

struct UnmapArena {
  arenaId @0 :UInt64;
}

struct UnmapArenaReply {
  arenaId @0 :UInt64;
}

# Frees the job: its partitions' memory and NVMe extents, its metadata, its arenas. Its
# checkpoints stay.
struct DropJob {}

struct DropJobReply {
  partitions @0 :UInt64;
  bytesFreed @1 :UInt64;     # RAM charges and NVMe extents given back
}

# Removes one of the requester's checkpoints (a Checkpoint's `name`, resolved the same way)
# from the service's state directory: what a trainer's `--keep-last` retires.
struct DeleteCheckpoint {
  name @0 :Text;
}

struct DeleteCheckpointReply {
  bytesFreed @0 :UInt64;
}

struct ErrorReply {
  code @0 :ErrorCode;
  message @1 :Text;
}

# The envelope: frame 0 of every message.
struct Header {
  schemaVersion @0 :UInt16;
  requestId @1 :UInt64;      # chosen by the requester, echoed in the reply
  jobId @2 :Text;
  # Describes frame 1 when the kind carries a payload (setParameters, pushGradients,
  # fetchReply, unless its `arena` is set); both are zero otherwise.
  payloadLength @3 :UInt64;
  payloadCrc32c @4 :UInt32;

  kind :union {
    register @5 :Register;
    registerReply @6 :RegisterReply;
    setParameters @7 :SetParameters;
    setParametersReply @8 :SetParametersReply;
    pushGradients @9 :PushGradients;
    pushReply @10 :PushReply;
    commitStep @11 :CommitStep;
    skipStep @12 :SkipStep;
    commitReply @13 :CommitReply;
    fetchParameters @14 :FetchParameters;
    fetchReply @15 :FetchReply;
    stats @16 :Stats;
    statsReply @17 :StatsReply;
    checkpoint @18 :Checkpoint;
    checkpointReply @19 :CheckpointReply;
    restore @20 :Restore;
    restoreReply @21 :RestoreReply;
    ping @22 :Ping;
    pong @23 :Pong;
    errorReply @24 :ErrorReply;
    mapArena @25 :MapArena;
    mapArenaReply @26 :MapArenaReply;
    unmapArena @27 :UnmapArena;
    unmapArenaReply @28 :UnmapArenaReply;
    dropJob @29 :DropJob;
    dropJobReply @30 :DropJobReply;
    deleteCheckpoint @31 :DeleteCheckpoint;
    deleteCheckpointReply @32 :DeleteCheckpointReply;
  }
}

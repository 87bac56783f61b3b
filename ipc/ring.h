/*
 * ipc/ring.h - the flowmover shared-memory ring: layout and operations.
 *
 * This one header is the contract between every party that touches a ring:
 * libflowshm (producers and consumers in applications), moverd (which creates
 * rings, scans producer rings and deposits into consumer rings) and the
 * network transports (which copy spans of committed records byte for byte
 * into a peer ring of the same size, at the same offsets).
 *
 * ---------------------------------------------------------------------------
 * Memory layout of one ring object (a memfd or a file, mapped shared)
 * ---------------------------------------------------------------------------
 *
 *   offset 0       struct fr_shared   control page, FR_CTRL_BYTES (8 KiB)
 *   offset 8192    data area          ring_bytes, a power of two >= 4 KiB
 *
 * The control page is split into 128-byte lines so that the words written
 * by one side never share a cache line (or an adjacent-line prefetch pair)
 * with the words written by the other side (format version 2):
 *
 *   line 0      geometry     written once at creation, read-only afterwards
 *   line 1      state        flags (CLOSED, FAILED, ENDED), recovery counter,
 *                            producer attach numbers: rarely written
 *   line 2      producer     tail: the claim position (all producers CAS it);
 *                            back-pressure counters (written only when full);
 *                            records claimed (each producer handle adds its
 *                            count every FR_COUNT_EVERY records and whenever
 *                            it waits, wakes a sleeper, ends or detaches)
 *   line 3      subscribers  mask of ACTIVE subscriber slots, the floor
 *                            (position kept when no subscriber is active),
 *                            max_lag: written at attach/detach only
 *   line 4      deposit      published: deposit rings only (see below)
 *   line 5      data wake    futex word, count of sleeping consumers, and
 *                            the doorbell arm word (moverd wants a ring)
 *   line 6      space wake   futex word + "producers sleeping" count
 *   line 7      status       written by moverd only: the flow's state as
 *                            clients see it (struct fr_status)
 *   lines 8-23  subscriber slots 0..FR_MAX_SUBS-1, one line each
 *   lines 24-31 producer slots 0..FR_MAX_PRODS-1, 16 bytes each: slot i
 *               is on line 24 + i % 8, so the first eight producers of a
 *               ring write a line each (see Producer slots)
 *   lines 32-35 producer slot tags (format 4, Liveness): written when a
 *               slot is taken or given back, read only by recovery
 *   line 36     when a producer last judged the subscribers holding it
 *               back (Subscribers: dead subscribers; a compatible
 *               addition to format 4): written at most every 10 ms
 *   lines 37-38 producer slot sleep marks (Sleeping and waking:
 *               sleepers that die asleep; a compatible addition to
 *               format 4): written when a producer sleeps for space
 *   lines 39-63 unused (zero)
 *
 * ---------------------------------------------------------------------------
 * Subscribers (format 2): several consumers, each at its own position
 * ---------------------------------------------------------------------------
 *
 * A ring has up to FR_MAX_SUBS subscribers.  Each owns one slot: its own
 * position `pos` (everything before it this subscriber is done with), the
 * records it consumed, and its state (FREE, ACTIVE, CUT).  Every subscriber
 * sees every record, in order.  Subscribers are local consumer processes
 * and, on a sending host, moverd itself (one slot per peer host it sends
 * the flow to).  A slot is taken with a CAS FREE -> ACTIVE; moverd frees the
 * slot of a client whose control connection closes (crash) and the slot of
 * a client that detaches.  Producers may overwrite space only below the
 * minimum `pos` of the ACTIVE slots (or below `floor` when none is active):
 * the slowest attached subscriber holds producers back, as Aeron's min flow
 * control.  With max_lag != 0, a producer that finds the ring full because
 * one subscriber is more than max_lag bytes behind the tail cuts it off
 * (CAS ACTIVE -> CUT, clear its mask bit); that subscriber then gets
 * -ESTALE and may re-attach at the current position.
 *
 * Dead subscribers.  moverd gives back the slot of a client whose control
 * connection closes.  On a ring without moverd (flowshm_open_fd) nobody
 * would, and a consumer that died would hold the producers back for good.
 * So a producer the ring holds back (one that waits for room, or gives up
 * on a full ring) judges the holders of the ACTIVE slots at the lowest
 * position and gives back those of dead processes (judged as Liveness
 * says: not at all by a client in another pid namespace than moverd's).
 * A judgement costs a kill(2) and a read of /proc per slot (about 14 us
 * on the 2-vCPU test host), so a ring takes one per FR_ROOM_LOOK_NS,
 * whoever waits (`judged_ns`, taken by CAS), and a handle at most one per
 * FR_ROOM_LOOK_NS whatever that word says (a stamp from the future, of
 * another time namespace or a scribbling client, counts as none).  A
 * subscriber that finds no free slot does the same for every slot before
 * it gives up (-EBUSY).  A client leaves alone what only moverd can
 * judge: HELD slots, and slots in pid 0 (a client whose pid moverd cannot
 * see; also a slot in the instant between its take's CAS and the store of
 * its pid).  As for any leave, the last subscriber's position becomes
 * the floor, so what the dead one had not read is kept; what it read but
 * had not yet published (lazy publishing, below) the next one reads
 * again.
 *
 * moverd's slots are HELD (CAS ACTIVE -> HELD once taken): producers never
 * cut them, because bytes of a HELD slot may be in a send still in flight
 * (a socket send queued in the kernel, an RDMA WRITE not yet read by the
 * NIC), which a cut would let producers overwrite before they leave the
 * host.  moverd applies max_lag to them itself: when the ring is full (a
 * producer waits, or a largest record would not fit) and its slot is more
 * than max_lag behind, it cuts it (HELD -> CUT) once no send of it is in
 * flight.  A producer that finds the ring full with max_lag set rings the
 * flow's doorbell, so moverd looks at once.  (A compatible addition to
 * format 2: an older library's CAS from ACTIVE never cuts a HELD slot.)
 * Only moverd gives its own slot back: a leave on another party's behalf
 * (a client's detach, a judge of dead holders) passes over the slot its
 * handle holds, whatever gen or pid a client wrote into the ring (a
 * client that could steer its old slot's gen to the one moverd took it
 * at would otherwise free moverd's slot at its detach, and moverd's
 * handle would forget it held one).
 *
 * A new subscriber joins at the minimum position of the active ones (or at
 * `floor`): set pos, publish the slot (CAS state, then set the mask bit,
 * seq_cst), then re-read the minimum of the others and move pos up to it if
 * it moved meanwhile (nothing has been read yet, so moving up loses nothing
 * this subscriber had a right to).  When the last active subscriber leaves,
 * its position becomes the floor, so records nobody has read are kept.
 *
 * (Implementation, a fix to the design above: re-reading the others'
 * minimum is not enough, a producer may have read the mask before our bit
 * and the others' positions after they moved, and overwritten what we are
 * about to read.  So a producer raises `floor` (fetch-max, seq_cst) to the
 * minimum it is about to rely on and then re-reads the mask, computing
 * again if it changed; a joiner, after setting its bit, moves up to the
 * floor as well: one of the two sees the other.  The floor is thus also
 * "nothing below it may still be read".  A producer's cached minimum never
 * decreases: a lower position is a joiner about to move up, or a client
 * lowering its own word, and is ignored rather than failed.)
 *
 * A subscriber publishes its position lazily (issue 12): its private head
 * advances per record; `pos` (and `records`) are stored every
 * FR_PUBLISH_BYTES or ring_bytes/8 (the smaller), whenever producers are
 * sleeping (producers_waiting != 0, checked after each release with the
 * fence below), before it sleeps, when it finds nothing to read while a
 * producer waits, and when it detaches.  (Implementation note: a producer
 * that gives up on a full ring - a try-once send - sets FR_SPACE_WANTED in
 * producers_waiting (fr_want_space), so that the subscribers publish on
 * their next release and one recv frees room for one try-once send; a
 * producer that only spins does not set it.  The publisher clears it.)
 *
 * ---------------------------------------------------------------------------
 * Producer slots (format 3; held by every producer since format 4)
 * ---------------------------------------------------------------------------
 *
 * Each producer holds one of FR_MAX_PRODS slots: its pid (0 = free) and a
 * generation, taken like a subscriber slot (moverd takes it at attach in
 * the client's pid and gives it back when the client's control connection
 * closes; a producer of a ring without moverd takes one itself).  Its one
 * busy word is `claim`: before its first CAS of tail for a claim, from the
 * tail t it read, the producer stores t | FR_CLAIM_BUSY there (once: tail
 * only grows, so the claim it wins starts at or above t), and it stores 0
 * once every header of its claim is written.  So a claim whose headers are
 * not all written yet is always named by a busy slot at or below its
 * start, and recovery (below) can ask whether the producer that may own a
 * headerless gap is still alive.  The words are the producer's own: a
 * producer alone on its line never shares it, and nobody else reads it but
 * a recovering subscriber.  (Stored before every CAS attempt instead, it
 * cost 16 producers about 7% of their 32 B per-record rate: eight lines
 * for sixteen slots, and retries are many when sixteen contend.)
 *
 * A producer holds its slot from attach to detach, and its CLAIMED
 * headers are judged through it (Liveness: reused pids).  With all
 * FR_MAX_PRODS slots taken (and none of a dead holder to take back), a
 * new producer is refused (-EBUSY) rather than run without one.
 *
 * ---------------------------------------------------------------------------
 * Liveness: whose pids (a compatible addition)
 * ---------------------------------------------------------------------------
 *
 * Slots and record headers name processes by pid, and recovery (below)
 * and the taking back of slots ask whether such a pid is alive.  A pid
 * means something only in one pid namespace, and a client in a container
 * has another pid there than in moverd's.  So every pid in a ring that
 * moverd hands out is a pid as moverd sees it: moverd takes slots in the
 * pid of the client's socket (SO_PEERCRED), and tells the client at
 * attach which pid that is and which pid namespace it judges in; the
 * client then writes that pid in its headers and its own slots
 * (fr_pid_view), FR_PID_UNKNOWN if moverd cannot see it at all.  A
 * client in another pid namespace than moverd's never judges a pid: to
 * it every pid is alive (pids_foreign), and moverd, which can judge,
 * runs recovery for the flows such consumers read, at the slowest
 * published position (such a consumer publishes where it waits once it
 * finds it cannot judge the claim there).  FR_PID_UNKNOWN is
 * alive to everyone: a process moverd cannot see, dead in a claim, stalls
 * its flow rather than having a live one's record padded.  A process
 * that attaches without moverd writes and judges in its own pids, as
 * before.
 *
 * Reused pids (format 4).  A pid alone does not name a process for long:
 * once a dead one is reaped, the kernel may hand its pid to a new process,
 * and a claim of the dead one would then stall its flow for as long as the
 * new one lives.  So every slot carries a tag of its holder, taken with
 * it: the holder's start time (/proc/PID/stat, in clock ticks, its low 32
 * bits) and the time namespace it was read in (the low 32 bits of the
 * inode of /proc/self/ns/time; start times read in two time namespaces
 * differ).  A slot's holder is dead when its pid is, or when the process
 * now behind that pid started at another time (read in the same time
 * namespace; in another one, or with tag 0, the pid alone decides, as in
 * format 3).  A pid is reused only after a lap of every pid, which takes
 * far longer than a tick.  Whoever takes a slot stores the tag once its
 * CAS (acq_rel) made the slot its; whoever gives one back stores tag 0
 * before the release that frees the slot: a judge that reads a slot's pid
 * or state (acquire) then reads its holder's tag or 0, never the tag of
 * the one before.  A CLAIMED header
 * names its producer by pid only, so it is judged through the slots: in
 * format 4 every producer holds a slot from attach to detach, and a
 * claim of its is committed before it gives the slot back, so a CLAIMED
 * header whose pid holds no producer slot, or only slots of dead
 * holders, is a dead producer's.  (moverd gives back a client's slots
 * when its control connection closes, so a producer attached through
 * moverd is known dead at once, whatever became of its pid.)  The one
 * claim named by no slot is an END record moverd writes while all
 * FR_MAX_PRODS slots are held: it is committed right after, and padded
 * only if moverd stops for a recovery timeout in between.
 *
 * ---------------------------------------------------------------------------
 * Doorbell (format 2)
 * ---------------------------------------------------------------------------
 *
 * moverd does not sleep on one futex per ring: it shares a doorbell page
 * (ipc/bell.h) with its clients of each uid, one bit per flow plus one futex
 * word.  When
 * moverd has drained a sender ring and wants to be told of the next record
 * it stores `bell_armed` = 1 (then fence, then re-checks the ring).  A
 * producer, after committing (release) and the fence of the wake protocol,
 * reads `bell_armed`; only when it is set does it clear it (exchange, so one
 * producer rings) and ring the flow's bit in the doorbell page.  The bell
 * index and page come from moverd's attach answer, never from the ring.
 *
 * ---------------------------------------------------------------------------
 * Status (format 2)
 * ---------------------------------------------------------------------------
 *
 * moverd writes struct fr_status (line 7) when the flow's state changes:
 * open, waiting for its peer, peer down since, draining, ended, failed with
 * a reason.  Clients only read it (flowshm_state): a producer that timed
 * out can tell a slow consumer from a link that is down.  `epoch` is the
 * start count of the moverd that owns the ring now: a client that sees it
 * change knows the daemon restarted (and re-adopted the ring).

 * Positions are 64-bit byte counts that only grow ("free running"); the
 * offset of a position in the data area is pos & (ring_bytes - 1).  A
 * position never wraps in practice (2^64 bytes), so no ABA on positions:
 * a ring starts at most at FR_START_MAX (a peer names a receiver's start),
 * 2^63 bytes before any wrap (29 years at 10 GB/s).
 *
 * ---------------------------------------------------------------------------
 * Records
 * ---------------------------------------------------------------------------
 *
 * Every record starts with a 16-byte struct fr_rec and is followed by its
 * payload; the total size is rounded up to FR_ALIGN (16) bytes, so every
 * record header and payload is 8-byte (in fact 16-byte) aligned.  A record is
 * always contiguous in the data area: when it would cross the end of the
 * data area, a PAD record fills the rest of the lap and the record starts at
 * offset 0 of the next lap.  A reader may therefore use a payload in place.
 *
 *   seal   (pos ^ seal_key) | state     state = CLAIMED (1) or COMMITTED (2)
 *   len    payload bytes (DATA) or bytes after the header (PAD)
 *   info   bit 31 = PAD; bit 30 = CTRL (a control record: len 8, payload a
 *          uint64_t FR_CTRL_* kind; consumers never see it as data);
 *          bits 22..29 = the producer's attach number (mod 256) and bits
 *          0..21 = its pid (pids are < 2^22 on Linux): together, a stable
 *          identity of the producer that wrote the record
 *
 * End of stream: when every producer of a flow has declared the end of its
 * stream (flowshm_end), or the flow's owner closes its input, the flow gets
 * one CTRL record of kind FR_CTRL_END after every data record, and the
 * ENDED flag.  It travels between hosts byte for byte like data, so it
 * survives restarts and link cuts exactly as data does.  A consumer that
 * reaches it gets -ENODATA (end of stream) from then on, never the record.
 *
 * The seal binds a header to its absolute position: a header left over from
 * an earlier lap at the same offset carries another position and never
 * matches, and stale payload bytes match only if they happen to equal a
 * 64-bit value mixed with the ring's random seal_key.  So a reader never
 * needs the data area to be zeroed.
 *
 * Producer protocol (any number of producer processes):
 *   1. claim:  CAS tail from t to t + need (need includes a PAD if the record
 *              must wrap).  Space is free when t + need - head <= ring_bytes.
 *   2. header: store len and info, then seal = CLAIMED (release), so that a
 *              recovering reader that sees CLAIMED can trust len and info.
 *   3. write the payload.
 *   4. commit: seal = COMMITTED (release): publishes header and payload.
 *   5. fence (light, see below), then wake the consumer only if its
 *      sleeping flag is set.
 *
 * Consumer protocol (each subscriber: an application or moverd; a reader
 * without a slot hands nothing back to the producers):
 *   read the seal at its private head (acquire).  COMMITTED for this
 *   position: validate len against the geometry the consumer copied at
 *   attach time (never the shared copy), use the payload, advance the
 *   private head; publish it to its slot's pos (release) lazily (see
 *   Subscribers), fence, and wake producers only if any is sleeping and
 *   the wake room is free (below).
 *   Recovery (below) pads a dead producer's record with a CAS on the seal,
 *   so several subscribers may run it at once.
 *
 * Recovery of a producer killed between claim and commit: the consumer finds
 * head < tail and the seal at head not COMMITTED for longer than the
 * recovery timeout.  If the seal is CLAIMED and the producer named in info
 * is dead (no producer slot of a live holder has its pid: Liveness), the
 * record becomes a PAD of the claimed length.  If no header was written yet
 * (killed between the CAS and step 2), the consumer scans forward for the
 * next position that carries a CLAIMED or COMMITTED seal of its own (or up
 * to tail) and pads the gap (a MiB at most per call, the rest on the next
 * calls without another timeout: a gap can be a lap long, and a recoverer
 * may be moverd's event loop), but only when no producer slot of a live pid
 * is busy with a claim that starts below the gap's end (Producer slots):
 * the gap carries no pid of its own, and a producer that is alive but
 * stopped (SIGSTOP, a frozen vCPU) right after its CAS would otherwise be
 * taken for dead, and write its record, once continued, into space the
 * subscribers have passed (lost although its send succeeded, or a lap
 * later over another record: tests/test_stopped_producer.c).  Records of
 * other producers are never touched.  Known limit: a live producer
 * stopped while its slot is busy holds back recovery of any gap above its
 * claim start (the flow waits for it, as for a live producer's CLAIMED
 * record).
 *
 * Deposit rings (the consumer end of a flow between hosts): moverd copies
 * spans into the data area in any byte order (RDMA gives no placement
 * order inside one WRITE) and then stores `published` (release).  The
 * consumer reads only below `published`, and a record there whose seal does
 * not match is corruption (-EPROTO), not "not yet written".
 *
 * ---------------------------------------------------------------------------
 * Sleeping and waking
 * ---------------------------------------------------------------------------
 * A side that wants to sleep reads the futex word, sets its flag, issues a
 * full fence, re-checks the ring and only then calls FUTEX_WAIT on the word.
 * The other side publishes (release store), issues a fence, and reads the
 * flag; only when it is set does it bump the futex word and FUTEX_WAKE.
 * The two fences make it impossible for both to miss each other (Dekker);
 * the futex word closes the window between the re-check and the wait.  No
 * system call is made while nobody sleeps.
 *
 * The fences are asymmetric (ipc/barrier.h, issue 12): a producer's fence
 * after its commit (and moverd's after a deposit, and a subscriber's after
 * it publishes its position) is only a compiler barrier in a process that
 * registered for membarrier(2), which fr_attach does; a sleeper that slept
 * FM_BRIEF_SLEEP_NS without a wake takes membarrier(GLOBAL_EXPEDITED), the
 * heavy fence that stands for all of theirs, re-checks, and only then
 * sleeps on (fr_sleep_two_phase; moverd's doorbell arms: mover.c).  A
 * consumer's fence in fr_release stays full (ring.c says why).  A process
 * whose registration failed fences fully.  A format 2 client would sleep
 * without the heavy fence and could miss a wake-up for good, so this is
 * format 3 (same layout): a format 2 client, or a format 2 ring file left
 * in moverd's state directory, gets -EPROTO with both versions named.
 *
 * Producers asleep for space are woken once the wake room is free: a
 * quarter of the ring, or the largest record if that is more (issue 12).
 * Woken at every publication, a producer came back for each acknowledged
 * frame and preempted the moverd that was freeing its ring (64 KiB records
 * over 8 flows: 9-21% more records/s woken at the quarter, docs/performance.md);
 * woken at the quarter, it refills a quarter in one go.  The sleeper
 * re-checks the same room after its fence.  Room below it wakes nobody, so a
 * sleeping producer looks every FR_ROOM_LOOK_NS and tries its claim once the
 * subscribers moved: a record that fits waits at most that long, also when
 * the subscribers stop short of the quarter (a consumer that waits for this
 * very producer on another ring).  All subscribers caught up means the whole
 * ring is free, so a drained ring always wakes its producers at once.  The
 * layout and the handshake are format 3's: a client built before this
 * re-checks only that the subscribers moved, so it goes on at the quarter
 * or after its brief sleep (FM_BRIEF_SLEEP_NS) if they had moved by then,
 * and otherwise sleeps until the quarter or its deadline.
 *
 * Sleepers that die asleep (a compatible addition to format 4).  The
 * counts of sleepers (consumers_waiting, producers_waiting) are raised
 * before a sleep and lowered after it, so a sleeper killed asleep
 * (SIGKILL, the OOM killer) would leave its count raised for good, and
 * every commit or release after it would make a futex wake (28 times
 * the cost of a 32 B record).  So a sleeper with a slot also marks
 * itself in its slot: a consumer in its subscriber slot's `asleep`, a
 * producer in `prod_asleep[slot]`.  It raises the count, then adds one
 * to its mark (release: who takes the mark sees the raise before it);
 * once awake it takes one back from its mark, and lowers the count only
 * if there was one to take.  Whoever gives a slot back (its holder
 * detaching, moverd for a client whose control connection closed, a
 * judge of dead holders: every way goes through fr_sub_leave or
 * fr_prod_leave) takes the whole mark (exchange, acquire) and lowers the
 * count by it, then wakes that side's futex: a holder alive after all
 * (a handle closed while another thread of it slept) wakes and counts
 * itself anew.  Each unit of a mark is thus taken once, by the sleeper
 * or by the one leave of its slot, and lowers the count once; the count
 * is never below the sum of the marks, and a leave never lowers it below
 * zero (nor into its flag bit) whatever a client scribbled in a mark.
 * A mark is a count, not a flag: one handle may sleep twice at once on
 * its slot (a flowshm_set's helper thread armed, and the application's
 * own flowshm_set_poll with a timeout).  Limits: a sleeper killed between
 * its raise and its mark (a few instructions) still leaks its count, as
 * does one that sleeps without a slot (a reader that holds none) and one
 * of a library built before the marks; a leave by such a library
 * leaves the mark on the free slot, and the next leave of that slot
 * takes it (the count it lowers is still the dead sleeper's raise).  A
 * slot given back while its holder is alive and asleep on it, then taken
 * by another that sleeps on it too, may have its new holder's unit taken
 * by the old one: the count then misses one sleeper until it wakes on
 * its own (a misuse: a handle used by two threads at once).
 */
#ifndef FLOWMOVER_IPC_RING_H
#define FLOWMOVER_IPC_RING_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <errno.h>
#include <stdint.h>

struct fr_bell; /* ipc/bell.h */

#define FR_MAGIC         0x474e49524d574c46ULL /* "FLWMRING" in memory */
#define FR_VERSION       4u   /* 2: subscribers, status, doorbell arm, CTRL;
				 * 3: the same layout, asymmetric fences in
				 * the wake-up protocol (a format 2 sleeper
				 * would miss a light fence's wake-up);
				 * 4: an 8 KiB control page with slot tags,
				 * every producer holds a slot (Liveness:
				 * reused pids) */
#define FR_CTRL_BYTES    8192u
#define FR_LINE          128u
#define FR_ALIGN         16u
#define FR_REC_HDR       16u
#define FR_MIN_RING      4096ull
#define FR_MAX_RING      (1ull << 34) /* 16 GiB */
#define FR_START_MAX     (1ull << 63) /* the furthest first position */
#define FR_MAX_SUBS      16u
#define FR_MAX_PRODS     64u
#define FR_CLAIM_BUSY    1ull /* in fr_prod.claim: a claim at or above
				 (claim & ~1) is in progress */
#define FR_PUBLISH_BYTES (64u * 1024u) /* lazy head: publish at least this often */
#define FR_ROOM_LOOK_NS  10000000ull /* a producer asleep for space looks for
					room below the wake room this often */

#define FR_SEAL_CLAIMED   1ull
#define FR_SEAL_COMMITTED 2ull
#define FR_SEAL_STATE     7ull /* positions are 16-aligned: low bits are free */
/* Format 2: a subscriber is turning this record into padding (recovery).
 * Recovery takes the seal with a CAS to this state first, so that of
 * several subscribers recovering at once only one writes len and info
 * (their gap lengths may differ); the others wait for the COMMITTED pad. */
#define FR_SEAL_RECOVERING 3ull

#define FR_INFO_PAD      0x80000000u
#define FR_INFO_CTRL     0x40000000u
#define FR_INFO_PRODUCER 0x3fffffffu /* attach number << 22 | pid */
#define FR_INFO_PID      0x003fffffu
#define FR_INFO_ATTACH_SHIFT 22
/* A pid nobody judges (Liveness): the largest pid the info word holds
 * (Linux's largest possible pid, PID_MAX_LIMIT - 1, so a real one is rare,
 * and only ever counts as alive). */
#define FR_PID_UNKNOWN   FR_INFO_PID

#define FR_CTRL_END      1ull /* payload of a CTRL record: end of stream */

#define FR_FLAG_CLOSED   1u
#define FR_FLAG_FAILED   2u  /* with CLOSED: moverd failed the flow because
				of what it read in this ring: -EPROTO */
#define FR_FLAG_ENDED    4u  /* the END record is written: producers get
				-EPIPE, consumers -ENODATA once they reach it */
#define FR_FLAG_ENDING   8u  /* fr_write_end began: producers get -EPIPE
				already (set before the END record is claimed,
				so no data record lands after it; see
				fr_write_end), ENDED follows once it is written */

/* consumers_waiting: sleeping client subscribers are counted in the low
 * bits; moverd (which sleeps on many rings at once and may give up a sleep
 * half-armed) sets this bit instead, so its mark is idempotent and never
 * unbalances the clients' count. */
#define FR_WAITING_MOVERD 0x80000000u

/* producers_waiting: sleeping producers are counted in the low bits; this
 * bit says "a producer found the ring full": subscribers publish their
 * position on their next release (see Subscribers), nobody is woken. */
#define FR_SPACE_WANTED  0x80000000u

enum fr_mode {
	FR_MODE_LOCAL = 0,   /* producers commit by sealing each record */
	FR_MODE_DEPOSIT = 1, /* moverd deposits spans and stores `published` */
};

enum fr_sub_state {
	FR_SUB_FREE = 0,
	FR_SUB_ACTIVE = 1,
	FR_SUB_CUT = 2,      /* cut off by max_lag: -ESTALE until it leaves */
	FR_SUB_HELD = 3,     /* moverd's: active, cut only by moverd */
};

/* The flow's state as moverd last wrote it (struct fr_status.state). */
enum fr_flow_state {
	FR_STATE_UNKNOWN = 0,    /* no moverd status (ring from open_fd) */
	FR_STATE_OPEN = 1,       /* moving: the peer (if any) is connected */
	FR_STATE_CONNECTING = 2, /* the peer was never reached yet */
	FR_STATE_PEER_DOWN = 3,  /* the peer link is down since since_ns */
	FR_STATE_DRAINING = 4,   /* destroy --drain: no new sends */
	FR_STATE_ENDED = 5,      /* end of stream written */
	FR_STATE_FAILED = 6,     /* failed: reason is an errno */
	FR_STATE_CLOSED = 7,     /* destroyed */
};

struct fr_rec {
	_Atomic uint64_t seal;
	_Atomic uint32_t len;
	_Atomic uint32_t info;
};

struct fr_geometry {
	uint64_t magic;
	uint32_t version;
	uint32_t ctrl_bytes;
	uint64_t ring_bytes;
	uint32_t max_record;
	uint32_t mode;
	uint64_t seal_key;
	uint64_t created_ns; /* CLOCK_REALTIME, for operators */
};

/* One subscriber's line. */
struct fr_sub {
	_Alignas(FR_LINE) _Atomic uint64_t pos; /* published lazily (release) */
	_Atomic uint64_t records;  /* records consumed, published with pos */
	_Atomic uint32_t state;    /* enum fr_sub_state */
	_Atomic uint32_t pid;      /* holder, for operators and recovery */
	_Atomic uint64_t gen;      /* bumped at each take: who holds it now */
	_Atomic uint64_t tag;      /* the holder's tag (Liveness): start
				      time << 32 | time namespace */
	_Atomic uint32_t asleep;   /* the holder's sleepers counted in
				      consumers_waiting (Sleeping and waking:
				      sleepers that die asleep); zero in a
				      ring older than the marks */
};

/* One producer's slot (lines 24-31, Producer slots). */
struct fr_prod {
	_Atomic uint64_t claim; /* t | FR_CLAIM_BUSY while claiming at >= t */
	_Atomic uint32_t pid;   /* holder; 0 = free */
	_Atomic uint32_t gen;   /* bumped at each leave: a stale leave fails */
};

/* moverd's view of the flow, for clients (line 7); moverd is its only writer. */
struct fr_status {
	_Atomic uint32_t seq;       /* odd while moverd writes (seqlock) */
	_Atomic uint32_t state;     /* enum fr_flow_state */
	_Atomic uint32_t reason;    /* errno when FAILED, else 0 */
	_Atomic uint32_t producers; /* producers attached through moverd */
	_Atomic uint32_t consumers; /* consumers attached through moverd */
	_Atomic uint32_t pad_;
	_Atomic uint64_t since_ns;  /* CLOCK_REALTIME of the last state change */
	_Atomic uint64_t epoch;     /* start count of the moverd owning the ring */
};

struct fr_shared {
	_Alignas(FR_LINE) struct fr_geometry geo;
	_Alignas(FR_LINE) _Atomic uint32_t flags;
	_Atomic uint32_t recovered;     /* records turned into padding */
	_Atomic uint32_t producer_seq;  /* attach numbers handed to producers */
	_Alignas(FR_LINE) _Atomic uint64_t tail;
	_Atomic uint64_t full_events;   /* a producer found the ring full */
	_Atomic uint64_t full_ns;       /* time producers spent waiting for space */
	/* data records producers claimed (every claim is committed, or padded
	 * over by recovery if its producer dies first: `recovered`); END and
	 * pads are not counted.  Reported by moverd, never trusted.  A ring
	 * made before this word existed starts it at 0 (same layout).
	 * Each producer handle adds its claims in batches (fr_count_flush):
	 * while one is busy the word trails it by < FR_COUNT_EVERY records,
	 * and a producer killed mid-batch never adds its last ones. */
	_Atomic uint64_t records;
	_Alignas(FR_LINE) _Atomic uint32_t sub_mask; /* bit i: slot i ACTIVE */
	_Atomic uint32_t pad_;
	_Atomic uint64_t floor;         /* kept position when no slot is active */
	_Atomic uint64_t max_lag;       /* 0 = lossless; else cut laggards */
	_Alignas(FR_LINE) _Atomic uint64_t published;
	_Alignas(FR_LINE) _Atomic uint32_t data_futex;
	_Atomic uint32_t consumers_waiting; /* count of sleeping subscribers */
	_Atomic uint32_t bell_armed;    /* moverd wants a doorbell ring */
	_Alignas(FR_LINE) _Atomic uint32_t space_futex;
	_Atomic uint32_t producers_waiting;
	_Alignas(FR_LINE) struct fr_status status;
	struct fr_sub subs[FR_MAX_SUBS];
	/* indexed through fr_prod_at, never directly */
	_Alignas(FR_LINE) struct fr_prod prods[FR_MAX_PRODS];
	/* prod_tags[i]: the tag of slot i's holder, as fr_sub.tag */
	_Alignas(FR_LINE) _Atomic uint64_t prod_tags[FR_MAX_PRODS];
	/* when a producer held back last judged the subscribers that hold
	 * it back (Subscribers: dead subscribers), its CLOCK_MONOTONIC ns */
	_Alignas(FR_LINE) _Atomic uint64_t judged_ns;
	/* prod_asleep[i]: slot i's holder's sleepers counted in
	 * producers_waiting, as fr_sub.asleep */
	_Alignas(FR_LINE) _Atomic uint32_t prod_asleep[FR_MAX_PRODS];
};

_Static_assert(sizeof(struct fr_shared) <= FR_CTRL_BYTES, "control page");
_Static_assert(sizeof(struct fr_rec) == FR_REC_HDR, "record header");
/* the producer slots sit where rings made before them have zeros */
_Static_assert(offsetof(struct fr_shared, prods) == 24 * FR_LINE &&
	       sizeof(struct fr_prod) == 16, "producer slots");
_Static_assert(offsetof(struct fr_shared, prod_tags) == 32 * FR_LINE,
	       "producer slot tags");
_Static_assert(offsetof(struct fr_shared, judged_ns) == 36 * FR_LINE,
	       "the last judgement of dead subscribers");
/* the sleep marks sit where rings made before them have zeros */
_Static_assert(offsetof(struct fr_sub, asleep) == 40 &&
	       sizeof(struct fr_sub) == FR_LINE, "subscriber sleep mark");
_Static_assert(offsetof(struct fr_shared, prod_asleep) == 37 * FR_LINE,
	       "producer slot sleep marks");

/* Parameters of a new ring. */
struct fr_params {
	uint64_t ring_bytes; /* power of two, FR_MIN_RING..FR_MAX_RING */
	uint32_t max_record; /* 1..ring_bytes/2 payload bytes */
	uint32_t mode;       /* enum fr_mode */
	uint64_t seal_key;   /* 0 = pick a random key */
	uint64_t start;      /* first position (FR_ALIGN-aligned, at most
				FR_START_MAX): a deposit ring resumes
				where its producer ring stands */
};

/*
 * A process's private view of a mapped ring.  Geometry is copied here once,
 * after validation, and never re-read from shared memory: a client that
 * scribbles on the control page cannot make us index out of bounds.
 */
struct fr_ring {
	struct fr_shared *sh;
	unsigned char *data;
	uint64_t size;       /* ring_bytes */
	uint64_t mask;       /* size - 1 */
	uint64_t key;        /* seal_key with the low state bits cleared */
	uint32_t max_record;
	uint32_t mode;
	size_t map_bytes;

	/* consumer side: one subscriber slot */
	uint64_t head;       /* private position; published lazily to subs[sub] */
	uint64_t head_pub;   /* last head stored in subs[sub].pos */
	uint64_t records;    /* records consumed (private count) */
	uint64_t pub_every;  /* publish after this many bytes */
	uint64_t tail_cache; /* last tail seen (deposit: last published seen) */
	uint64_t stuck_pos;  /* recovery: position we found not committed */
	uint64_t stuck_since_ns;
	uint64_t recover_ns; /* recovery timeout, 0 = never */
	uint64_t sub_gen;    /* gen of our slot when we took it */
	unsigned sub;        /* our slot, FR_MAX_SUBS = none */

	/* producer side */
	uint64_t head_cache; /* last minimum subscriber position seen */
	uint32_t pid;        /* info word: attach number << 22 | self_pid */
	uint32_t self_pid;   /* the pid we write in slots and headers: our
				own, or the one moverd sees (Liveness) */
	bool pids_foreign;   /* the ring's pids are of another pid
				namespace: none is judged dead here */
	struct fr_bell *bell; /* moverd's doorbell page (attach), or NULL */
	uint32_t bell_index; /* this flow's bit in it (checked < its size) */
	uint32_t uncounted;  /* data records claimed, not yet in sh->records */
	uint64_t judged_ns;  /* when we last looked at the subscribers that
				hold us back (Subscribers: dead subscribers) */
	unsigned prod;       /* our producer slot, FR_MAX_PRODS = none */
	uint32_t prod_gen;   /* its gen when we took it */

	/* moverd's own max_lag (fr_pin_max_lag): this handle's decisions read
	 * it, not the ring's word, which any client of the ring may write */
	bool lag_pinned;
	uint64_t lag_pin;
};

/* Sizes. */
static inline uint64_t fr_align(uint64_t n)
{
	return (n + FR_ALIGN - 1) & ~(uint64_t)(FR_ALIGN - 1);
}

/* Bytes a record of `len` payload bytes occupies in the data area. */
static inline uint64_t fr_record_bytes(uint64_t len)
{
	return fr_align(FR_REC_HDR + len);
}

static inline size_t fr_map_bytes(uint64_t ring_bytes)
{
	return (size_t)(FR_CTRL_BYTES + ring_bytes);
}

static inline uint64_t fr_seal(const struct fr_ring *r, uint64_t pos,
			       uint64_t state)
{
	return (pos ^ r->key) | state;
}

static inline struct fr_rec *fr_rec_at(const struct fr_ring *r, uint64_t pos)
{
	return (struct fr_rec *)(r->data + (pos & r->mask));
}

/* Bytes from pos to the end of its lap. */
static inline uint64_t fr_lap_rest(const struct fr_ring *r, uint64_t pos)
{
	return r->size - (pos & r->mask);
}

static inline bool fr_closed(const struct fr_ring *r)
{
	/* acquire: a reader that sees CLOSED also sees the final positions */
	return atomic_load_explicit(&r->sh->flags, memory_order_acquire) &
	       FR_FLAG_CLOSED;
}

/* What a closed ring's ends get: -EPROTO if moverd failed the flow for
 * what it found in the ring, else -EPIPE. */
static inline int fr_closed_rc(const struct fr_ring *r)
{
	return atomic_load_explicit(&r->sh->flags, memory_order_acquire) &
	       FR_FLAG_FAILED ? -EPROTO : -EPIPE;
}

/* --- set-up (ring.c) ---------------------------------------------------- */

/* Validate params; 0 or -EINVAL. */
int fr_params_check(const struct fr_params *p);

/* Initialise a zeroed mapping of fr_map_bytes(p->ring_bytes) bytes. */
void fr_format(void *map, const struct fr_params *p);

/*
 * Validate the control page of a mapping of map_bytes bytes and fill *r.
 * -EPROTO for a bad magic, version, geometry or size mismatch.
 */
int fr_attach(struct fr_ring *r, void *map, size_t map_bytes);

/* Mark the ring closed and wake every sleeper on both sides. */
void fr_close(struct fr_ring *r);
/* The same, and its ends get -EPROTO (FR_FLAG_FAILED): moverd's verdict
 * on a ring whose words its own client corrupted. */
void fr_fail(struct fr_ring *r);

/* --- producer (ring.c) --------------------------------------------------- */

/*
 * A claim: `n` records placed back to back from `pos`; their headers are
 * written (CLAIMED) and their payload pointers are fr_rec_at(pos)+1, etc.
 */
struct fr_claim {
	uint64_t pos;   /* position of the first record */
	uint64_t end;   /* position after the last record */
	unsigned n;
};

/*
 * Claim space for up to `n` records whose payload lengths are lens[i]
 * (each already checked to be 1..max_record).  Claims as many as fit,
 * contiguously, within one lap; at least one, or none and returns -EAGAIN
 * (full), -EPIPE (closed) or -EPROTO (positions corrupt).  A PAD at the end
 * of a lap is written and committed here when needed.
 */
int fr_claim(struct fr_ring *r, const uint32_t *lens, unsigned n,
	     struct fr_claim *c);

/* Commit every record of a claim, then wake the consumer if it sleeps. */
void fr_commit(struct fr_ring *r, const struct fr_claim *c);

/* Give a claim up: its space becomes committed padding (readers pass it
 * as nothing), and its records leave the count.  For a producer that goes
 * with a reservation pending: left claimed, it would hold every reader
 * for as long as any other producer slot of its pid lives (recovery
 * judges a claim by its pid). */
void fr_cancel(struct fr_ring *r, const struct fr_claim *c);

/*
 * How many claimed records a producer handle keeps to itself before it adds
 * them to the shared `records` count: one locked add per claim was 12% of
 * the 32 B per-record rate (issue 11).  The handle also adds what it holds
 * when it waits for space, wakes a sleeping consumer, ends or detaches.
 */
#define FR_COUNT_EVERY 64u

/* Add this handle's uncounted claims to the shared `records` word. */
static inline void fr_count_flush(struct fr_ring *r)
{
	if (!r->uncounted)
		return;
	/* relaxed: a count for operators, ordered with nothing */
	atomic_fetch_add_explicit(&r->sh->records, r->uncounted,
				  memory_order_relaxed);
	r->uncounted = 0;
}

/* Free bytes right now as seen by a producer (refreshes the head cache
 * from the minimum subscriber position). */
int fr_refresh_head(struct fr_ring *r, uint64_t *free_bytes);

/* A producer gives up on a full ring (returns -EAGAIN to its caller), or
 * polls it without sleeping: ask the subscribers to publish their position
 * on their next release. */
void fr_want_space(struct fr_ring *r);

/* A producer that polled a full ring (never asleep in fr_wait_space) until
 * there was room or it gave up, since t0_ns: count it in the ring's
 * back-pressure counters as fr_wait_space counts a sleep. */
void fr_note_full(struct fr_ring *r, uint64_t t0_ns);

/* Take this producer's attach number (fetch_add of producer_seq) into the
 * info word of every record it writes. */
void fr_producer_number(struct fr_ring *r);

/* Liveness (above): this process attached through a moverd that sees it
 * as seen_pid (0: it cannot see us), in the same pid namespace as ours or
 * not.  Call before taking a slot; the info word follows. */
void fr_pid_view(struct fr_ring *r, uint32_t seen_pid, bool same_ns);

/* This process's pid namespace (the inode of /proc/self/ns/pid), 0 if
 * unknown (no /proc). */
uint64_t fr_pid_ns(void);

/* Producer slots (ring.h, Producer slots).  Slot i lives on line i % 8 of
 * the eight, so that the first eight producers write a line each. */
static inline struct fr_prod *fr_prod_at(const struct fr_ring *r, unsigned i)
{
	unsigned per_line = FR_LINE / sizeof(struct fr_prod);

	return &r->sh->prods[(i % (FR_MAX_PRODS / per_line)) * per_line +
			     i / (FR_MAX_PRODS / per_line)];
}

/* Producer slots free now (a count for moverd's limits on guests). */
unsigned fr_prod_free_slots(const struct fr_ring *r);

/* Take a free producer slot in `pid` (moverd for a client at attach, or a
 * producer of a ring without moverd), taking back slots of dead pids if
 * none is free: *slot and *gen say which.  -EBUSY if all are held. */
int fr_prod_take(struct fr_ring *r, uint32_t pid, unsigned *slot,
		 uint32_t *gen);

/* Claim through the slot (taken for us by moverd): -ESTALE if it is not
 * held with this gen any more. */
int fr_prod_adopt(struct fr_ring *r, unsigned slot, uint32_t gen);

/* Give a slot back (the producer detached, or moverd saw it die).  Of two
 * leaves of the same slot and gen one does it; a stale gen does nothing. */
void fr_prod_leave(struct fr_ring *r, unsigned slot, uint32_t gen);

/* Give back every producer slot whose holder pid is dead; how many. */
unsigned fr_prod_leave_dead(struct fr_ring *r);

/* The producer identity in a record header (attach number << 22 | pid). */
static inline uint32_t fr_rec_producer(const struct fr_rec *h)
{
	return atomic_load_explicit(&((struct fr_rec *)h)->info,
				    memory_order_relaxed) & FR_INFO_PRODUCER;
}

/* Write the END control record after everything committed so far and set
 * ENDED (moverd, or a lone producer of a ring without moverd).  -EAGAIN if
 * it does not fit yet, -EPIPE if closed, 0 if written or already ended. */
int fr_write_end(struct fr_ring *r);

/* Is there news for a consumer at pos: a committed record, or the ring
 * closed and drained there (a claim still open on a closed ring is not
 * news: its commit or its recovery is)?  Reads the shared page and the
 * handle's geometry only. */
bool fr_data_at(const struct fr_ring *r, uint64_t pos);

/*
 * The sleeper's half of the wake-up protocol, once it read the futex word
 * (v), counted itself, fenced fully and found nothing: sleep on word until
 * `until` (absolute CLOCK_MONOTONIC ns), at most FM_BRIEF_SLEEP_NS at
 * first; then the heavy fence, ready(r, arg) again, and the rest of the
 * sleep (ipc/barrier.h: the busy side fences lightly).  0: look again
 * (woken, or membarrier is missing and the caller sleeps briefly again);
 * -ETIMEDOUT at `until`.
 */
int fr_sleep_two_phase(struct fr_ring *r, _Atomic uint32_t *word,
		       uint32_t v, uint64_t until,
		       bool (*ready)(struct fr_ring *, uint64_t), uint64_t arg);

/* --- subscribers (ring.c) ------------------------------------------------ */

/* The minimum position of the active subscribers, or the floor (acquire:
 * a producer overwrites below it only after their reads are done). */
uint64_t fr_min_pos(const struct fr_ring *r);

/* Take a free slot for a new subscriber (moverd at attach, or a client of
 * a ring without moverd) at the minimum position; *slot and *gen say which.
 * With none free, slots of dead holders are given back first (Subscribers:
 * dead subscribers).  -EBUSY if every slot is taken, -EPROTO if the words
 * are corrupt. */
int fr_sub_take(struct fr_ring *r, uint32_t pid, unsigned *slot,
		uint64_t *gen);

/* Become the subscriber of slot (taken for us by moverd): -ESTALE if the
 * slot is not ACTIVE with this gen any more. */
int fr_sub_adopt(struct fr_ring *r, unsigned slot, uint64_t gen);

/* Give a slot back (the client detached, or moverd saw it die): producers
 * waiting on it are released at once.  The last one leaves its position
 * as the floor. */
void fr_sub_leave(struct fr_ring *r, unsigned slot, uint64_t gen);

/* fr_sub_leave of another party's slot (moverd, for a client that
 * detached): a no-op on the slot this handle holds itself. */
void fr_sub_leave_other(struct fr_ring *r, unsigned slot, uint64_t gen);

/* Publish our private head to our slot now (lazy publishing otherwise). */
void fr_sub_publish(struct fr_ring *r);

/* Cut off every active subscriber (as max_lag would): each gets -ESTALE
 * from its next read.  moverd, on a receiving host whose subscription on
 * the sending host was cut (fan-out --max-lag): "you were cut" reaches
 * the consumers there with the same meaning.  Returns how many. */
unsigned fr_sub_cut_all(struct fr_ring *r);

/* How many subscriber slots are FREE now (a CUT one is taken until its
 * holder leaves, though its sub_mask bit is clear): moverd's limit on
 * guests' slots (control.c). */
unsigned fr_sub_free_slots(const struct fr_ring *r);

/* Was our slot cut off by max_lag (or taken from us)?  A consumer that
 * copied a record checks this after the copy: -ESTALE if true. */
bool fr_sub_lost(const struct fr_ring *r);

/* moverd: take a slot at the minimum position, adopt it and make it HELD
 * (producers never cut it; see Subscribers), then fr_sub_skip_lag.  As
 * fr_sub_take. */
int fr_sub_take_held(struct fr_ring *r, uint32_t pid);

/* moverd at a start, when fr_sub_take_held found every slot taken: take
 * over, where it stands, the HELD slot of a dead holder (the last moverd)
 * furthest behind, as our own.  It never leaves the mask: giving it back
 * first would let producers write over what its peer has not
 * acknowledged before our take.  -EBUSY if there is none. */
int fr_sub_take_over_held(struct fr_ring *r, uint32_t pid);

/* moverd, for a slot it has just taken (its own, or a client's before the
 * answer) with max_lag set: a join position more than max_lag behind the
 * tail (every other subscriber was cut, the floor is where they were)
 * moves forward over whole committed records to within max_lag / 2 of it,
 * so "attach again at the current position" is not cut again at once.
 * It walks 2^18 records at most (moverd's loop, at every attach): one
 * left further behind moves up again at its next attach. */
void fr_sub_skip_lag(struct fr_ring *r, unsigned slot);

/* moverd: its own max_lag for this handle's decisions (fr_sub_skip_lag,
 * fr_sub_cut_held and the rest), also stored in the ring's word for the
 * clients' producers.  Without it a handle reads the ring's word, which a
 * client may rewrite: a client of a lossless flow made moverd cut a peer's
 * subscription (and skip records for it) by writing one there. */
void fr_pin_max_lag(struct fr_ring *r, uint64_t lag);

/* moverd, for its HELD slot, with none of its sends in flight: cut it
 * (HELD -> CUT, as a producer cuts a client's) if it is more than max_lag
 * behind the tail while the ring is full (a producer waits, or a record of
 * max_record bytes would not fit).  True if this call cut it. */
bool fr_sub_cut_held(struct fr_ring *r);

/* moverd re-adopting a ring after a restart: give back every slot of the
 * mask `slots` whose holder is dead, pid 0 included (a client the old
 * moverd could not see); returns how many.  The clients that held them
 * connected to the moverd that died.  moverd calls it again once a second
 * for the slots it inherited that are still ACTIVE (flows_watch_inherited,
 * issue 15): a consumer that outlived the old moverd has no connection to
 * the new one, so its death later would otherwise hold producers back for
 * good.  Only those: a slot the new moverd took in pid 0 is a live client
 * it cannot see. */
unsigned fr_sub_leave_dead(struct fr_ring *r, uint32_t slots);

/* --- status (ring.c): moverd writes, clients read ------------------------ */

struct fr_status_view {
	uint32_t state, reason, producers, consumers;
	uint64_t since_ns, epoch;
};

void fr_status_set(struct fr_ring *r, enum fr_flow_state state,
		   uint32_t reason);
void fr_status_counts(struct fr_ring *r, uint32_t producers,
		      uint32_t consumers);
void fr_status_epoch(struct fr_ring *r, uint64_t epoch);
/* A consistent copy (seqlock; gives up after a few tries: -EAGAIN). */
int fr_status_read(const struct fr_ring *r, struct fr_status_view *out);

/* --- doorbell (ring.c, ipc/bell.h) ---------------------------------------- */

/* moverd: ask the producers of this ring to ring the doorbell on their
 * next commit (store, fence; the caller then re-checks the ring, and
 * again behind the heavy fence before a long sleep: ipc/barrier.h). */
void fr_bell_arm(struct fr_ring *r);

/* --- consumer (ring.c) --------------------------------------------------- */

/*
 * Find the record at the consumer's head, skipping (and releasing) padding.
 * On 0, *rec is the validated record at r->head with *len payload bytes.
 * -EAGAIN: none committed yet; -EPIPE: closed and drained; -EPROTO: corrupt.
 * May run producer-crash recovery (see above) when stuck long enough.
 */
int fr_peek(struct fr_ring *r, const struct fr_rec **rec, uint32_t *len);

/* Release everything before `pos` (a position returned by fr_peek + size). */
void fr_release(struct fr_ring *r, uint64_t pos);

/*
 * For moverd, the consumer of a producer ring that sends spans to a peer:
 * the end of the run of committed records from `pos`, stopping before
 * `limit` (records are never split).  Pads count as records.  *stuck is set
 * when the run stops at a record claimed but not committed (a caller may
 * then run fr_check_stuck).  -EPROTO if a committed header is invalid.
 */
int fr_scan(const struct fr_ring *r, uint64_t pos, uint64_t limit,
	    uint64_t *end, bool *stuck);

/* fr_scan that also adds the data records of the run (neither pads nor
 * control records) to *records: moverd's per-flow record counters. */
int fr_scan_records(const struct fr_ring *r, uint64_t pos, uint64_t limit,
		    uint64_t *end, bool *stuck, uint64_t *records);

/* fr_scan_records that stops after max records (pads included): a walk on
 * moverd's event loop whose bytes a client may have filled with 16-byte
 * pads.  A run cut there is neither stuck nor an error. */
int fr_scan_records_max(const struct fr_ring *r, uint64_t pos,
			uint64_t limit, unsigned max, uint64_t *end,
			bool *stuck, uint64_t *records);

/*
 * moverd, the one sender of a ring: the committed pad at pos, if longer
 * than `piece` bytes (a multiple of FR_ALIGN), becomes pads of `piece`
 * (the last one shorter), so that it goes on a shared connection a
 * quantum at a time as records do, not as one frame of up to a lap (a
 * client commits pads of any length it likes).  The pads inside are
 * written first, the first one's length last: a reader that sees the new
 * length finds the next pad sealed, one that read the old one skips them
 * all.  Only while no send in flight reads those bytes (a fan-out flow's
 * other subscriptions may): the caller's to know.  True if it split.
 */
bool fr_split_pad(struct fr_ring *r, uint64_t pos, uint64_t piece);

/*
 * Does a record begin at pos: on the record grid, and sealed (claimed,
 * committed or being recovered) for pos itself?  Inside a record the
 * word is payload, which a peer's position must not name: moverd would
 * send, release or recover from the middle of a record.  The caller
 * knows the positions nothing may be written at yet (tail).
 */
bool fr_rec_begins(const struct fr_ring *r, uint64_t pos);

/* Producer-crash recovery at pos (see above), for scanners.  0 = the
 * record at pos was turned into padding; -EAGAIN = keep waiting. */
int fr_check_stuck(struct fr_ring *r, uint64_t pos);

/* moverd, for a local flow whose consumers may not judge pids (Liveness):
 * fr_check_stuck at the slowest subscriber's position (*pos), run on
 * moverd's own timer (r->stuck_pos), as a consumer stuck there would.  A
 * position off the record grid or outside the window below tail is left
 * alone.  0 = a record there was turned into padding; else -EAGAIN (or
 * fr_check_stuck's other errors). */
int fr_recover_slowest(struct fr_ring *r, uint64_t *pos);

/* --- waiting (ring.c) ---------------------------------------------------- */

/* Sleeping and waking: sleepers that die asleep.  A consumer's mark: its
 * subscriber slot's, NULL without a slot. */
_Atomic uint32_t *fr_data_mark(const struct fr_ring *r);

/* Count a sleeper in *count (seq_cst, as every raise of a sleeper count
 * was) and then in its mark (NULL: the count only).  The caller's full
 * fence and re-check follow, as before any sleep. */
void fr_sleeper_in(_Atomic uint32_t *count, _Atomic uint32_t *mark);

/* The sleeper is awake: take its unit back from its mark, and lower the
 * count only if it was still there (a leave of the slot took it and
 * lowered the count itself).  Without a mark, lower the count. */
void fr_sleeper_out(_Atomic uint32_t *count, _Atomic uint32_t *mark);

/* Sleep until data may be there, closed, or deadline (CLOCK_MONOTONIC ns;
 * UINT64_MAX = forever).  Returns 0 or -ETIMEDOUT; callers re-check. */
int fr_wait_data(struct fr_ring *r, uint64_t deadline_ns);
/* Sleep until room (ring.h, Sleeping and waking), closed, the end of the
 * stream began (ENDING: it turns producers away), or deadline.  Returns 0
 * or -ETIMEDOUT, and 0 at the deadline if the subscribers moved: callers
 * try their claim again. */
int fr_wait_space(struct fr_ring *r, uint64_t deadline_ns);
/* The same through ENDING: for the writer of the end record, who set it. */
int fr_wait_room(struct fr_ring *r, uint64_t deadline_ns);

/* --- deposit rings (ring.c) ---------------------------------------------- */

/* Publish deposited bytes up to `pos` and wake the consumer if it sleeps. */
void fr_publish(struct fr_ring *r, uint64_t pos);

uint64_t fr_now_ns(void);

#endif

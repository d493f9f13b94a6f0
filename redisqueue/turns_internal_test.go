package redisqueue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/ginqueue/ginqueue/backend"
	"github.com/redis/go-redis/v9"
)

// rawShares is a replica of a Shares Name that is never started: the test
// makes its syncs by hand, with the demand it chooses.
type rawShares struct {
	t      *testing.T
	b      *Backend
	seq    int64
	window int64 // the claim window (ms) it sends
}

// rawFleet builds n replicas of one fresh Shares Name under limit, on the
// Redis of make test.
func rawFleet(t *testing.T, n, limit int) (*redis.Client, []*rawShares) {
	t.Helper()
	rdb := testRedis(t)
	name := freshName("turns-")
	rs := make([]*rawShares, n)
	for i := range rs {
		b, err := New(rdb, Options{Name: name, Mode: Shares})
		if err != nil {
			t.Fatal(err)
		}
		b.base = []any{limit, b.opts.LeaseTTL.Milliseconds(), b.lists, b.replica}
		rs[i] = &rawShares{t: t, b: b, window: 1_000}
	}
	t.Cleanup(func() {
		for _, r := range rs {
			_, _ = r.b.call(sharesScript, "bye")
		}
	})
	return rdb, rs
}

// sync reports held slots and a demand of need at priority 0, with need -
// held waiting, and returns the reply.
func (r *rawShares) sync(held, need int) shareReply {
	r.t.Helper()
	bands := "-"
	if need > 0 {
		bands = "0:" + strconv.Itoa(need)
	}
	return r.syncBands(held, need, bands)
}

// syncBands is sync with the demand split as bands says.
func (r *rawShares) syncBands(held, need int, bands string) shareReply {
	r.t.Helper()
	r.seq++
	res, err := r.b.call(sharesScript, "sync", held, need, bands, max(need-held, 0), "", 0, 0,
		int64(10_000), int64(0), 1, r.seq, r.window)
	if err != nil {
		r.t.Fatal(err)
	}
	rep, err := parseShareReply(res)
	if err != nil {
		r.t.Fatal(err)
	}
	return rep
}

// holdIdle makes r, the first replica with demand under a limit of
// limit, hold every slot as room for arrivals, its demand gone.
func (r *rawShares) holdIdle(limit int64) {
	r.t.Helper()
	r.sync(0, 1)
	if rep := r.sync(int(limit), 0); rep.held != limit {
		r.t.Fatalf("the idle holder kept %d slots, want %d (room for arrivals)", rep.held, limit)
	}
}

// told reports whether Redis told r that slots are free for it and is
// waiting for its claim.
func (r *rawShares) told(rdb *redis.Client) bool {
	r.t.Helper()
	err := rdb.ZScore(context.Background(), r.b.keys[skSN], r.b.replica).Err()
	if err != nil && !errors.Is(err, redis.Nil) {
		r.t.Fatal(err)
	}
	return err == nil
}

// A slot freed for a replica that then does not claim it (its requests
// went away before its sync) goes to the next replica in turn: that sync
// tells it. It used to stay free, told to nobody, until a waiter synced for
// another reason (at a thousand replicas, seconds later).
func TestTurnsAFreeSlotAlwaysHasAClaimant(t *testing.T) {
	rdb, rs := rawFleet(t, 3, 2)
	a, b, c := rs[0], rs[1], rs[2]
	if rep := a.sync(0, 2); rep.held != 2 {
		t.Fatalf("A alone got %d slots, want 2", rep.held)
	}
	b.sync(0, 2)
	c.sync(0, 2) // 3 least shares for 2 slots: the replicas take turns
	// A's turn goes back: B and C are told, each to claim one slot.
	if rep := a.sync(0, 2); rep.held != 0 {
		t.Fatalf("A kept %d slots after its turn", rep.held)
	}
	if !b.told(rdb) || !c.told(rdb) {
		t.Fatalf("B told %v, C told %v: want both", b.told(rdb), c.told(rdb))
	}
	if rep := b.sync(0, 2); rep.held != 1 || !rep.turn {
		t.Fatalf("B claimed %d slots (turn %v), want a turn of 1", rep.held, rep.turn)
	}
	// C's requests went away: it claims nothing, and A, next in turn, is
	// told of the slot C left.
	if rep := c.sync(0, 0); rep.held != 0 {
		t.Fatalf("C without demand got %d slots", rep.held)
	}
	if !a.told(rdb) {
		t.Fatal("a slot is free and A waits for a turn, but nobody was told")
	}
	// (With C gone, 2 slots serve the least shares of A and B: a share of
	// one each, no longer a turn.)
	if rep := a.sync(0, 2); rep.held != 1 {
		t.Fatalf("A claimed %d slots, want 1", rep.held)
	}
}

// Slots freed for more replicas than one call tells are told by the next
// calls: the replicas told and not synced since no longer hold back the
// others. At most 64 were told, whatever the slots free, and the rest
// waited for those 64 to claim theirs.
func TestTurnsTellEveryWaiterSlotsServe(t *testing.T) {
	const n = 100
	rdb, rs := rawFleet(t, n+1, n)
	holder, waiters := rs[0], rs[1:]
	holder.sync(0, n)
	for _, w := range waiters {
		w.sync(0, 1)
	}
	holder.sync(0, 0) // its demand gone: n slots free
	holder.sync(0, 0) // the next call tells those the first did not
	told := 0
	for _, w := range waiters {
		if w.told(rdb) {
			told++
		}
	}
	if told != n {
		t.Fatalf("%d slots free and %d replicas waiting for one each: %d told, want %d", n, n, told, n)
	}
}

// Replicas of a higher band that began to wait after others were told of
// free slots stand at the head of the turns, ahead of those told: slots
// freed next are told to them first. The replicas told were looked for
// only near their count, and the head was passed over.
func TestTurnsTellAHigherBandAheadOfThoseTold(t *testing.T) {
	const limit = 30
	rdb, rs := rawFleet(t, 1+20+10+3, limit)
	holder, lows, highs, heads := rs[0], rs[1:21], rs[21:31], rs[31:]
	holder.sync(0, limit)
	if got := holder.sync(limit, limit).held; got != limit {
		t.Fatalf("the holder holds %d slots, want %d", got, limit)
	}
	for _, w := range lows {
		w.syncBands(0, 1, "0:1")
	}
	holder.sync(20, 20) // 10 free: told to the first 10 of band 0
	for _, h := range highs {
		h.syncBands(0, 1, "5:1") // take those 10
	}
	for _, h := range heads {
		h.syncBands(0, 1, "5:1") // no slot free: they wait, at the head
	}
	holder.sync(5, 5) // 15 free
	for i, h := range heads {
		if !h.told(rdb) {
			t.Errorf("band-5 replica %d, at the head of the turns, was not told of 15 free slots", i)
		}
	}
}

// A replica whose demand is gone, with nothing running or waiting, while
// other replicas wait, gives its share back with the sync that reports it:
// the slots are free, and the waiters told, after one call. It used to
// report the share as held and give it back a sync later, and at a
// thousand replicas those second syncs doubled the calls as a load moved.
func TestAnIdleReplicaGivesBackWithItsReport(t *testing.T) {
	rdb, rs := rawFleet(t, 1, 2)
	w := rs[0]
	s := startedShares(t, 0)
	b := s.b
	b.rdb = rdb
	b.opts.Name = w.b.opts.Name
	b.keys, b.keyArgs = w.b.keys, w.b.keyArgs
	b.base = []any{2, b.opts.LeaseTTL.Milliseconds(), w.b.lists, b.replica}
	t.Cleanup(func() { _, _ = b.call(sharesScript, "bye") })
	w.sync(0, 0) // the Name's keys, made without the freeze of new keys
	if _, err := w.b.call(sharesScript, "bye"); err != nil {
		t.Fatal(err)
	}
	if err := s.sync(false, true); err != nil {
		t.Fatal(err)
	}
	if got := s.localLimit(); got != 2 {
		t.Fatalf("alone and idle, the replica holds %d slots, want 2 (room for arrivals)", got)
	}
	w.sync(0, 1) // waits: no slot is free
	s.shortLast.Store(true)
	if err := s.sync(true, false); err != nil {
		t.Fatal(err)
	}
	rec, err := rdb.HGet(context.Background(), b.keys[skS], b.replica).Result()
	if err != nil {
		t.Fatal(err)
	}
	if held, _ := strconv.Atoi(strings.Fields(rec)[0]); held != 0 {
		t.Fatalf("after the sync that reported it idle, Redis counts %d slots as the replica's, want 0", held)
	}
	if !w.told(rdb) {
		t.Fatal("the idle replica's slots are free, and the waiting replica was not told")
	}
}

// A turn is one least share, and the replica that holds it leaves the
// order of turns until it gives it back: with 2 slots and 3 replicas that
// each want 2, the first two get one each, and the third is first in turn.
func TestTurnsAreOneLeastShareEach(t *testing.T) {
	rdb, rs := rawFleet(t, 3, 2)
	a, b, c := rs[0], rs[1], rs[2]
	a.sync(0, 1) // one waiter: A's least share is all it wants
	b.sync(0, 2)
	c.sync(0, 2)
	a.sync(1, 2) // A's demand grows to 2 and its turn goes back: 1 slot held
	if rep := b.sync(0, 2); rep.held != 1 {
		t.Fatalf("B's turn is %d slots, want 1 (its least share)", rep.held)
	}
	sw := b.b.keys[skSW]
	order, err := rdb.ZRange(context.Background(), sw, 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range order {
		if id == b.b.replica {
			t.Fatalf("B holds its turn and is still in the order of turns %v", order)
		}
	}
}

// The coordinator rests while its waiters are not worth a sync: an arrival
// that finds no slot here, when no slot is free in the fleet and the demand
// did not grow, is not looked at again every gap (at saturation that was a
// wake-up every few milliseconds on every replica, for nothing).
func TestCoordinatorRestsWhileAWaiterIsNotWorthASync(t *testing.T) {
	s := startedShares(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	tk, err := s.mem.Acquire(ctx, backend.Arrival{Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.mem.Release(tk)
	go func() { _, _ = s.mem.Acquire(ctx, backend.Arrival{Cost: 1}) }()
	eventually(t, func() bool { return s.fast.Counts().Queued == 1 })
	s.needLast.Store(2)
	s.asked.Store(true)
	now := time.Now()
	gap := 6 * time.Millisecond
	p := pacer{opts: s.b.opts, last: now.Add(-10 * gap), renew: time.Second}
	if due, _ := s.due(now, &p, gap); due {
		t.Fatal("a waiter with no slot free and no growth made a sync due")
	}
	if next := s.nextSync(&p, gap); next.Before(p.last.Add(p.renew)) {
		t.Fatalf("the coordinator looks again in %v, want at the renewal (%v)", next.Sub(now), p.last.Add(p.renew).Sub(now))
	}
}

// A fall of the demand is reported only if it lasts a gap: closed
// loop clients between two requests leave the demand down for microseconds,
// and a sync each time was most of a saturated fleet's calls.
func TestADemandFallMustLast(t *testing.T) {
	s := startedShares(t, 4)
	ctx := context.Background()
	var tks []backend.Ticket
	for range 4 {
		tk, err := s.mem.Acquire(ctx, backend.Arrival{Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		tks = append(tks, tk)
	}
	s.needLast.Store(4)
	s.shortLast.Store(true)
	gap := s.gap()
	p := pacer{opts: s.b.opts, last: time.Now().Add(-time.Second), renew: time.Hour}
	for _, tk := range tks[:2] {
		s.release(tk) // down to 2 of 4: fell by more than a quarter
	}
	if !s.dropped.Load() {
		t.Fatal("the fall was not seen")
	}
	if due, _ := s.due(time.Now(), &p, gap); due {
		t.Fatal("a fall made a sync due at once")
	}
	// The demand is back before the window ends: no sync.
	for range 2 {
		tk, err := s.mem.Acquire(ctx, backend.Arrival{Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		tks = append(tks[2:], tk)
	}
	if due, _ := s.due(time.Now().Add(s.gap()+time.Millisecond), &p, gap); due {
		t.Fatal("a fall that did not last made a sync due")
	}
	// Down again, and it stays down past the window: a sync, as a fall.
	s.release(tks[0])
	s.release(tks[1])
	due, fell := s.due(time.Now().Add(s.gap()+time.Millisecond), &p, gap)
	if !due || !fell {
		t.Fatalf("a fall that lasted a gap: due %v, fell %v; want both", due, fell)
	}
	for _, tk := range tks[2:] {
		s.release(tk)
	}
}

// startedShares is the Shares state of a Backend that is not started, with
// its in-memory Backend started under a share of share slots.
func startedShares(t *testing.T, share int) *shares {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true}) // never called
	t.Cleanup(func() { _ = rdb.Close() })
	b, err := New(rdb, Options{Name: "rest", Mode: Shares})
	if err != nil {
		t.Fatal(err)
	}
	s := b.sh
	b.limits = backend.Limits{MaxConcurrent: 8, MaxQueue: 8, QueueTimeout: time.Minute}
	if err := s.mem.Start(b.limits); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.mem.Close() })
	if err := s.share.SetShare(share); err != nil {
		t.Fatal(err)
	}
	return s
}

// eventually polls cond for up to a second.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatal("condition not met within a second")
		}
		time.Sleep(time.Millisecond)
	}
}

// A turn goes back once nothing has run or waited on the replica for an
// idle window, not at its end: requests left on a replica the load moved
// away from held their turns, idle, for a second each, and a moving load
// took seconds to be served at a thousand replicas.
func TestATurnGoesBackWhenTheReplicaGoesIdle(t *testing.T) {
	s := startedShares(t, 1)
	now := time.Now()
	turn := func(idleFor time.Duration) {
		s.mu.Lock()
		s.local, s.turnEnd, s.idleAt = 1, now.Add(time.Second), now.Add(-idleFor)
		s.mu.Unlock()
		s.giveBack.Store(false)
		s.b.lastOK.Store(now.UnixNano()) // Redis answered just now
	}
	kept := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return !s.turnEnd.IsZero() && s.local == 1
	}
	turn(s.idleWindow() / 2)
	s.endTurn(now)
	if !kept() {
		t.Fatal("a turn went back after half an idle window")
	}
	turn(s.idleWindow() + time.Millisecond)
	s.endTurn(now)
	if kept() || !s.giveBack.Load() {
		t.Fatalf("a turn idle for an idle window: kept %v, given back %v", kept(), s.giveBack.Load())
	}
	// A request waits here again: the turn is kept for it.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_ = s.share.SetShare(0)
	go func() { _, _ = s.mem.Acquire(ctx, backend.Arrival{Cost: 1}) }()
	eventually(t, func() bool { return s.fast.Counts().Queued == 1 })
	turn(s.idleWindow() + time.Millisecond)
	s.endTurn(now)
	if !kept() {
		t.Fatal("a turn went back while a request waited for it")
	}
}

// A request of a band below the floor a reply gave waits outside the
// in-memory Backend, counted in Stats and in the demand reported, and goes
// on once the floor falls; the fast path is closed meanwhile; one whose
// context ends first gets its error, and a full queue answers full.
func TestRequestsBelowTheFloorWait(t *testing.T) {
	s := startedShares(t, 1)
	s.setFloor(10)
	if n := (sharesFast{s}).TryAcquire(); n != 0 {
		t.Fatal("the fast path admitted a request while a floor is set")
	}
	got := acquireLater(s, backend.Arrival{Cost: 1, Priority: 0})
	eventually(t, func() bool { return s.gatedN.Load() == 1 })
	if st := s.stats(); st.Queued != 1 || len(st.QueuedByPriority) != 1 || st.QueuedByPriority[0].Priority != 0 {
		t.Fatalf("Stats while gated: Queued %d by priority %v, want 1 at priority 0", st.Queued, st.QueuedByPriority)
	}
	if d := s.demand(true); d.queued != 1 || d.need != 1 || d.bands != "0:1" {
		t.Fatalf("demand while gated: %+v, want 1 waiting at band 0", d)
	}
	// A priority-10 request is not held.
	tk, err := s.acquire(context.Background(), backend.Arrival{Cost: 1, Priority: 10})
	if err != nil {
		t.Fatal(err)
	}
	s.release(tk)
	select {
	case err := <-got:
		t.Fatalf("the priority-0 request went on above the floor: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	s.setFloor(noBand)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Second):
		t.Fatal("the floor fell and the request still waits")
	}

	s.setFloor(10)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := s.acquire(ctx, backend.Arrival{Cost: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a gated request whose context ended: %v", err)
	}
	s.b.limits.MaxQueue = 0
	if _, err := s.acquire(context.Background(), backend.Arrival{Cost: 1}); !errors.Is(err, backend.ErrQueueFull) {
		t.Fatalf("a gated request with no waiting place: %v", err)
	}
}

// acquireLater acquires a on s in a goroutine, releases what it got at
// once, and sends the error.
func acquireLater(s *shares, a backend.Arrival) <-chan error {
	got := make(chan error, 1)
	go func() {
		tk, err := s.acquire(context.Background(), a)
		if err == nil {
			s.release(tk)
		}
		got <- err
	}()
	return got
}

// The time a request waits below the floor counts toward QueueTimeout: it
// is answered ErrQueueTimeout at QueueTimeout from its arrival, whether the
// floor stays, or falls late and the request then waits in the queue.
func TestAGatedRequestTimesOut(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := startedShares(t, 0)
		const timeout = 50 * time.Millisecond
		s.b.limits.QueueTimeout = timeout
		s.setFloor(10)
		start := time.Now()
		_, err := s.acquire(context.Background(), backend.Arrival{Cost: 1})
		if took := time.Since(start); !errors.Is(err, backend.ErrQueueTimeout) || took != timeout {
			t.Fatalf("held below the floor: %v after %v, want ErrQueueTimeout after %v", err, took, timeout)
		}
		// The floor falls after most of the wait: the rest is spent in the
		// queue (the share is 0, so nothing is granted).
		got := make(chan error, 1)
		start = time.Now()
		go func() {
			_, err := s.acquire(context.Background(), backend.Arrival{Cost: 1})
			got <- err
		}()
		synctest.Wait()
		if s.gatedN.Load() != 1 {
			t.Fatal("the request is not held below the floor")
		}
		time.Sleep(timeout * 3 / 5)
		s.setFloor(noBand)
		err = <-got
		if took := time.Since(start); !errors.Is(err, backend.ErrQueueTimeout) || took != timeout {
			t.Fatalf("gated, then queued: %v after %v, want ErrQueueTimeout after %v in all", err, took, timeout)
		}
	})
}

// The floor a reply gives is the lowest band the replica's share serves:
// with 4 slots, A's 1 request at priority 10 and 12 at priority 0, B's 6 at
// priority 5, A's share is for priority 10 alone; B serves every band it
// has, and so does a replica whose demand fits.
func TestTheFloorIsTheLowestBandServed(t *testing.T) {
	_, rs := rawFleet(t, 2, 4)
	a, b := rs[0], rs[1]
	if rep := a.syncBands(0, 1, "10:1"); rep.floor != noBand {
		t.Fatalf("a demand that fits the limit has floor %d, want none", rep.floor)
	}
	b.syncBands(0, 6, "5:6")
	if rep := a.syncBands(1, 13, "10:1,0:12"); rep.floor != 10 {
		t.Fatalf("A's floor is %d, want 10", rep.floor)
	}
	if rep := b.syncBands(0, 6, "5:6"); rep.floor != noBand {
		t.Fatalf("B's floor is %d, want none (one band)", rep.floor)
	}
}

// A holder asked to give slots back is not asked again by the next
// replica short of its share, until it synced: that one asks another
// holder (the same first holder used to be asked by everyone, and the
// others above their targets kept their slots).
func TestAHolderAskedIsPassedOver(t *testing.T) {
	rdb, rs := rawFleet(t, 3, 2)
	h, w1, w2 := rs[0], rs[1], rs[2]
	ctx := context.Background()
	h.holdIdle(2)
	notices := rdb.LLen(ctx, h.b.list)
	w1.sync(0, 2)
	if n := rdb.LLen(ctx, h.b.list).Val(); n != 1 {
		t.Fatalf("the holder has %d notices after a replica short of its share synced, want 1 (%v)", n, notices)
	}
	rdb.Del(ctx, h.b.list) // the holder read its notice, and has not synced yet
	w2.sync(0, 2)
	if n := rdb.LLen(ctx, h.b.list).Val(); n != 0 {
		t.Fatalf("the holder was asked again before it synced (%d notices)", n)
	}
	if rep := h.sync(2, 0); rep.held > 0 && !rep.shrink {
		t.Fatalf("the holder asked to give back keeps %d slots and is not told to shrink", rep.held)
	}
}

// A turn does not end while Redis is marked down: nobody could take the
// slot, and Redis counts it as this replica's until its lease runs out. A
// turn given back during a pause left the replica with no share, and it
// answered 503 until Redis was back.
func TestATurnIsKeptWhileRedisIsDown(t *testing.T) {
	s := startedShares(t, 1)
	now := time.Now()
	s.mu.Lock()
	s.local, s.turnEnd = 1, now.Add(-time.Millisecond)
	s.mu.Unlock()
	s.b.down.Store(true)
	s.endTurn(now)
	if s.localLimit() != 1 {
		t.Fatal("a turn ended while Redis was down")
	}
	s.b.down.Store(false)
	s.b.fails.Store(1) // this replica's last call failed: not marked down yet
	s.endTurn(now)
	if s.localLimit() != 1 {
		t.Fatal("a turn ended just after a call failed")
	}
	s.b.fails.Store(0)
	s.b.lastOK.Store(now.UnixNano())
	s.endTurn(now)
	if s.localLimit() != 0 {
		t.Fatal("a turn past its end was kept once Redis answered")
	}
}

// A turn that is up goes back only once Redis answered lately: the
// coordinator syncs first. With Redis just paused, every turn that ended
// was given back before the pause showed (a call fails only after its
// CallTimeout), and a fleet with turns ran nothing until Redis answered.
func TestATurnWaitsForAnAnswerBeforeItGoesBack(t *testing.T) {
	s := startedShares(t, 1)
	s.b.limit.Store(64) // turns of 128 ms: an answer 32 ms old is fresh
	now := time.Now()
	s.mu.Lock()
	s.local, s.turnEnd = 1, now.Add(-time.Millisecond)
	s.mu.Unlock()
	s.b.lastOK.Store(now.Add(-40 * time.Millisecond).UnixNano())
	s.endTurn(now)
	if s.localLimit() != 1 {
		t.Fatal("a turn went back while Redis had not answered for 40 ms")
	}
	if !s.confirm.Load() {
		t.Fatal("a turn waits for an answer, and the coordinator does not ask for one")
	}
	// The answer does not come (this client reaches no server): kept.
	s.confirmTurn()
	if s.localLimit() != 1 || s.confirm.Load() {
		t.Fatalf("no answer: share %d, asking again %v; want the turn kept, and asked for at the next look",
			s.localLimit(), s.confirm.Load())
	}
	s.b.fails.Store(0)
	s.b.lastOK.Store(now.Add(-20 * time.Millisecond).UnixNano())
	s.endTurn(now)
	if s.localLimit() != 0 {
		t.Fatal("a turn was kept though Redis answered 20 ms ago")
	}
}

// The answer a turn waits for is asked with the cheapest call there is,
// not a sync: a fleet of a thousand taking turns of a second each made
// half again as many script calls when each turn ended with a sync.
func TestATurnIsConfirmedWithAProbe(t *testing.T) {
	b, _ := internalBackend(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 1})
	s := startedShares(t, 1)
	s.b.rdb = b.rdb // a client of a live Redis
	s.b.keyArgs = b.keyArgs
	syncs := s.syncs.Load()
	s.b.limit.Store(64)
	now := time.Now()
	s.mu.Lock()
	s.local, s.turnEnd = 1, now.Add(-time.Millisecond)
	s.mu.Unlock()
	s.endTurn(now)
	s.confirmTurn()
	if s.localLimit() != 0 {
		t.Fatal("the turn was kept though Redis answered the probe")
	}
	if n := s.syncs.Load(); n != syncs {
		t.Fatalf("%d syncs to confirm a turn, want none", n-syncs)
	}
}

// While Redis is down, a replica of a large fleet probes a millisecond
// apart per replica from its second probe on, and keeps no probe waiting
// on a server that holds calls: a thousand replicas each dialling every
// few milliseconds filled the server's accept queue, and it answered none
// of them for seconds after it was back. A small fleet probes as before.
func TestALargeFleetProbesApart(t *testing.T) {
	o := settings{SharePeriod: 50 * time.Millisecond, CallTimeout: 150 * time.Millisecond}
	small := pacer{opts: o, slow: true, replicas: 4}
	if d := small.every(true); d != 0 {
		t.Fatalf("a small fleet's probe after a slow one waits %v, want 0", d)
	}
	large := pacer{opts: o, slow: true, replicas: 1024, missed: 2}
	for range 100 {
		if d := large.every(true); d < 800*time.Millisecond {
			t.Fatalf("a replica of 1,024 probes again after %v, want about a second", d)
		}
	}
	// The first probe after Redis is marked down comes soon in a large
	// fleet too: a burst of calls that Redis kept waiting past their
	// CallTimeout marked it down, and a replica without a share answered
	// 503 for a second, until its probe.
	for _, missed := range []int{0, 1} {
		first := pacer{opts: o, replicas: 1024, missed: missed}
		for range 100 {
			if d := first.every(true); d > 50*time.Millisecond {
				t.Fatalf("a replica of 1,024 probes %v after Redis was marked down (%d probes missed), want within 50 ms", d, missed)
			}
		}
	}
	// A replica that never had an answer (its fleet unknown) probes less
	// often at each probe that finds Redis still down, up to 32 times.
	unknown := pacer{opts: o}
	for missed, want := range []time.Duration{20, 40, 80, 160, 320, 640, 640, 640} {
		unknown.missed = missed
		if d := unknown.probeApart(); d != want*time.Millisecond {
			t.Fatalf("after %d probes that found Redis down: %v apart, want %v", missed, d, want*time.Millisecond)
		}
	}
}

// While Redis is marked down, arrivals do not probe sooner than the probe
// pace: every probe dials. A fleet of a thousand replicas under load
// probed on every arrival, thousands of dials a second.
func TestArrivalsProbeAtTheProbePace(t *testing.T) {
	s := startedShares(t, 0)
	now := time.Now()
	p := pacer{opts: s.b.opts, last: now.Add(-5 * time.Millisecond), renew: time.Hour, replicas: 1024, missed: 2}
	s.b.down.Store(true)
	s.asked.Store(true)
	s.b.resync.Store(true)
	if due, _ := s.due(now, &p, s.gap()); due {
		t.Fatal("an arrival probed 5 ms after the last probe, in a fleet of 1,024")
	}
	if next := s.nextSync(&p, s.gap()); next.Sub(p.last) < 800*time.Millisecond {
		t.Fatalf("the coordinator looks again %v after the last probe, want about a second", next.Sub(p.last))
	}
	if due, _ := s.due(now.Add(time.Second), &p, s.gap()); !due {
		t.Fatal("no probe a second after the last one, with a request waiting")
	}
	// A small fleet keeps one probe waiting on a server that holds calls.
	small := pacer{opts: s.b.opts, last: now, renew: time.Hour, replicas: 4, slow: true}
	s.asked.Store(true)
	if due, _ := s.due(now, &small, s.gap()); !due {
		t.Fatal("a small fleet's arrival did not probe after a slow probe")
	}
}

// A Backend whose go-redis client its owner closed (without closing the
// Backend) dials no connection of its own to probe: the client never
// answers again. Each probe used to dial one, and a fleet so cut off
// opened thousands of connections a second.
func TestAClosedClientIsNotProbed(t *testing.T) {
	b, rdb := internalBackend(t, backend.Limits{MaxConcurrent: 1, MaxQueue: 1})
	if !b.answersFresh(b.opts.CallTimeout) {
		t.Fatal("a fresh probe of a live Redis failed")
	}
	_ = rdb.Close()
	if _, err := b.call(probeScript); !errors.Is(err, redis.ErrClosed) {
		t.Fatalf("a call through a closed client: %v", err)
	}
	if b.answersFresh(b.opts.CallTimeout) {
		t.Fatal("a probe dialled Redis from the settings of a closed client")
	}
}

// Slots a replica holds beyond its demand, while others wait and none is
// free, are asked for by whoever syncs: a replica that went idle before
// anyone waited keeps its slots as room for arrivals and reports nothing
// more, and the replicas that wait, in turn order, may not sync either.
// At a thousand replicas such slots stayed idle for seconds.
func TestSlotsHeldBeyondDemandAreAskedForByAnySync(t *testing.T) {
	rdb, rs := rawFleet(t, 3, 2)
	h, w, x := rs[0], rs[1], rs[2]
	ctx := context.Background()
	h.holdIdle(2)
	w.sync(0, 2) // short of its share: asks h
	// As if that request went astray: h is not waiting to answer it, and
	// has been silent for a claim window.
	rdb.ZRem(ctx, h.b.keys[skSV], h.b.replica)
	rdb.Del(ctx, h.b.list)
	x.window = 400 // a holder is silent after 100 ms
	x.sync(0, 0)   // too soon: h synced within a quarter of the claim window
	if n := rdb.LLen(ctx, h.b.list).Val(); n != 0 {
		t.Fatalf("a holder that just synced was asked again (%d notices)", n)
	}
	time.Sleep(120 * time.Millisecond)
	x.sync(0, 0) // a renewal of another replica, with no demand
	if n := rdb.LLen(ctx, h.b.list).Val(); n != 1 {
		t.Fatalf("slots held beyond demand while a replica waits: the holder got %d notices, want 1", n)
	}
	checkTotals(t, rdb, h)
}

// checkTotals fails unless sm's E is the slots held beyond demand over
// the records of r's Name.
func checkTotals(t *testing.T, rdb *redis.Client, r *rawShares) {
	t.Helper()
	ctx := context.Background()
	recs := rdb.HVals(ctx, r.b.keys[skS]).Val()
	e := 0
	for _, rec := range recs {
		var held, need int
		if _, err := fmt.Sscanf(rec, "%d %d", &held, &need); err != nil {
			t.Fatal(err)
		}
		e += max(0, held-need)
	}
	if got, _ := rdb.HGet(ctx, r.b.keys[skSM], "E").Int(); got != e {
		t.Fatalf("sm's E is %d, the records hold %d beyond their demand", got, e)
	}
}

// A call that failed is tried again after a random wait, up to a
// CallTimeout doubled at each failure in a row: replicas whose calls
// failed together (a thousand started at once) tried again at once, and
// were marked down together.
func TestAFailedCallIsTriedAgainAtRandom(t *testing.T) {
	o := settings{CallTimeout: 100 * time.Millisecond, Mode: GlobalQueue}
	if d := retryAfter(o, 0); d != 0 {
		t.Fatalf("no failure: retry after %v, want 0", d)
	}
	for fails, most := range map[int32]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 9: 1600 * time.Millisecond} {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := retryAfter(o, fails)
			if d < 0 || d > most {
				t.Fatalf("%d failures: retry after %v, want at most %v", fails, d, most)
			}
			seen[d/(most/10)] = true
		}
		if len(seen) < 8 {
			t.Errorf("%d failures: retries fall in %d of 10 tenths of the range, want them spread", fails, len(seen))
		}
	}
	s := startedShares(t, 1)
	now := time.Now()
	p := pacer{opts: s.b.opts, last: now, renew: time.Hour, retry: 80 * time.Millisecond}
	s.b.fails.Store(1)
	if due, _ := s.due(now.Add(40*time.Millisecond), &p, s.gap()); due {
		t.Fatal("a failed call was tried again before its retry time")
	}
	if next := s.nextSync(&p, s.gap()); !next.Equal(now.Add(80 * time.Millisecond)) {
		t.Fatalf("the coordinator looks again %v after the failure, want 80ms", next.Sub(now))
	}
	if due, _ := s.due(now.Add(80*time.Millisecond), &p, s.gap()); !due {
		t.Fatal("a failed call was not tried again at its retry time")
	}
}

// A replica with nothing running or waiting, whose sync reported no
// demand, gives its share back when the reply says another replica's
// requests wait: kept as room for arrivals, it stayed idle until the
// replica's renewal (a second in a fleet of 256) while the load had moved
// to other replicas.
func TestAnIdleReplicaGivesItsRoomToWaiters(t *testing.T) {
	s := startedShares(t, 1)
	s.mu.Lock()
	s.local = 1
	s.mu.Unlock()
	rep := shareReply{held: 1, target: 1, limit: 8, replicas: 4}
	s.apply(rep, time.Now(), 0, false)
	if s.localLimit() != 1 {
		t.Fatal("an idle replica gave its room back while nobody waited")
	}
	rep.wanted = true
	s.apply(rep, time.Now(), 0, false)
	if s.localLimit() != 0 || !s.giveBack.Load() {
		t.Fatalf("an idle replica kept %d slots while others wait (give back: %v)", s.localLimit(), s.giveBack.Load())
	}
	// A replica whose requests run keeps its share.
	s.mu.Lock()
	s.local = 1
	s.mu.Unlock()
	_ = s.share.SetShare(1)
	tk, err := s.mem.Acquire(context.Background(), backend.Arrival{Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.mem.Release(tk)
	s.apply(rep, time.Now(), 0, false)
	if s.localLimit() != 1 {
		t.Fatal("a replica gave back the share its running request holds")
	}
}

// A reply that finds the fleet over its limit leaves this replica only
// the slots its requests run on, not its share. A sync sent just before
// the lease ran out reported the share; Redis, having counted the share
// away and given it to another replica meanwhile, counted it again on top,
// and the reply renewed the lease: a replica frozen for a lease took its
// share back beside the replica that had it, 6 slots running on 4.
func TestAReplyOverTheLimitKeepsOnlyWhatRuns(t *testing.T) {
	s := startedShares(t, 2)
	s.mu.Lock()
	s.local = 2
	s.mu.Unlock()
	tk, err := s.mem.Acquire(context.Background(), backend.Arrival{Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	rep := shareReply{held: 2, target: 2, limit: 4, replicas: 2, over: true}
	s.apply(rep, time.Now(), 6, false)
	if got := s.localLimit(); got != 1 {
		t.Fatalf("over the limit, a replica running 1 request kept a share of %d, want 1", got)
	}
	s.mem.Release(tk)
	s.apply(rep, time.Now(), 6, false)
	if got := s.localLimit(); got != 0 {
		t.Fatalf("over the limit, a replica running nothing kept a share of %d, want 0", got)
	}
}

// A turn whose requests outlast it goes back as they end; if Redis does
// not answer then, the replica takes the turn back, up to what Redis
// surely counts as its own: the report would not land, and the slot would
// stand idle until Redis answers. A pause that began between the turn's
// end and its requests' end left a fleet of 8 on 4 slots holding none.
func TestATurnIsTakenBackWhenItsReportCannotLand(t *testing.T) {
	s := startedShares(t, 1) // its client reaches no server: every call fails
	now := time.Now()
	s.mu.Lock()
	s.local, s.safe, s.turnEnd = 1, 1, now.Add(-time.Millisecond)
	s.leaseEnd = now.Add(time.Minute)
	s.mu.Unlock()
	tk, err := s.mem.Acquire(context.Background(), backend.Arrival{Cost: 1})
	if err != nil {
		t.Fatal(err)
	}
	s.b.lastOK.Store(now.UnixNano())
	s.endTurn(now) // Redis answered lately: the turn goes back
	if s.localLimit() != 0 {
		t.Fatal("the turn did not go back")
	}
	s.release(tk) // its request ends: the slot is to be reported free
	if !s.giveBack.Load() {
		t.Fatal("the slot of the turn is not to be reported")
	}
	later := now.Add(time.Second)
	s.b.lastOK.Store(now.UnixNano()) // and Redis has not answered since
	s.keepTurnIfSilent(later)
	if s.localLimit() != 1 || s.giveBack.Load() {
		t.Fatalf("Redis silent: share %d, report pending %v; want the turn taken back", s.localLimit(), s.giveBack.Load())
	}
	// Never above what Redis surely counts: a report of 0 that may have
	// landed leaves nothing to take back.
	s.mu.Lock()
	s.local, s.turnShare, s.safe = 0, 1, 0
	s.mu.Unlock()
	s.giveBack.Store(true)
	s.keepTurnIfSilent(later)
	if s.localLimit() != 0 {
		t.Fatal("a turn was taken back beyond what Redis surely counts")
	}
}

// weightedBelowFloor is a replica of weighted requests with no share, a
// floor at priority 10, and a fleet limit of 8.
func weightedBelowFloor(t *testing.T) *shares {
	s := startedShares(t, 0)
	s.b.limits.Weighted = true
	s.b.limit.Store(8) // the fleet's limit, which caps a cost
	s.setFloor(10)
	return s
}

// A weighted request held below the floor counts its cost once in the
// demand this replica reports: the cost it entered with, not that and
// again one for being held and its cost less one.
func TestAWeightedGatedRequestCountsOnce(t *testing.T) {
	s := weightedBelowFloor(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = s.acquire(ctx, backend.Arrival{Cost: 3, Priority: 0})
	}()
	eventually(t, func() bool { return s.gatedN.Load() == 1 })
	if p := s.peak.Load(); p != 3 {
		t.Errorf("one request of cost 3 held below the floor, nothing running: a peak demand of %d slots, want 3", p)
	}
	cancel()
	<-done
}

// The demand a replica reports puts a weighted request held below the
// floor in its own band, by its cost: a request of cost 5 at priority 0
// and one of cost 1 at priority 10 are "10:1,0:5". Its cost used to go to
// the top band ("10:5,0:1"), and Redis gave the replica's share to
// priority 10 while priority-5 requests waited elsewhere.
func TestAWeightedGatedRequestIsReportedInItsBand(t *testing.T) {
	s := weightedBelowFloor(t)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _, _ = s.acquire(ctx, backend.Arrival{Cost: 1, Priority: 10}) })
	eventually(t, func() bool { return s.fast.Counts().Queued == 1 })
	wg.Go(func() { _, _ = s.acquire(ctx, backend.Arrival{Cost: 5, Priority: 0}) })
	eventually(t, func() bool { return s.gatedN.Load() == 1 })
	if d := s.demand(true); d.bands != "10:1,0:5" {
		t.Errorf("demand by band %q, want %q", d.bands, "10:1,0:5")
	}
	if st := s.stats(); st.Queued != 2 {
		t.Errorf("Stats().Queued %d, want 2 requests", st.Queued)
	}
	cancel()
	wg.Wait()
}

// A replica whose lease ran out and that syncs before anyone swept it is
// still counted once. Its own sync used to sweep it (taking its slots out
// of the running totals) and then swap its old record for its report
// (taking them out again): Redis counted 2 slots fewer than the fleet
// held, and gave them to another replica over the limit.
func TestAReplicaPastItsLeaseIsCountedOnce(t *testing.T) {
	rdb, rs := rawFleet(t, 2, 4)
	a, b := rs[0], rs[1]
	const leaseMs = 150
	a.b.base[1] = int64(leaseMs)
	if rep := a.sync(0, 4); rep.held != 4 {
		t.Fatalf("A got %d slots, want 4", rep.held)
	}
	time.Sleep(2 * leaseMs * time.Millisecond) // A's lease runs out; nobody syncs
	if rep := a.sync(4, 4); rep.held != 4 {
		t.Fatalf("A kept %d slots, want the 4 it runs", rep.held)
	}
	held, err := rdb.HGet(context.Background(), a.b.keys[skSM], "H").Int64()
	if err != nil {
		t.Fatal(err)
	}
	if held != 4 {
		t.Fatalf("Redis counts %d slots held, want 4 (A's)", held)
	}
	if rep := b.sync(0, 4); rep.held != 0 {
		t.Fatalf("B got %d slots while A holds all 4", rep.held)
	}
}

// Every key of a Name has an expiry after every call, whatever the
// schedule made and deleted: a key left without one would outlive a fleet
// that was killed at once. A leaving replica's call used to leave sn
// without one.
func TestEveryKeyOfANameExpires(t *testing.T) {
	rdb, rs := rawFleet(t, 4, 3)
	ctx := context.Background()
	check := func(step string) {
		t.Helper()
		if k := keyWithoutExpiry(t, rdb, rs[0]); k != "" {
			t.Fatalf("after %s: key %s has no expiry", step, k)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	held := make([]int, len(rs))
	for i := range 400 {
		j := rng.IntN(len(rs))
		r := rs[j]
		if rng.IntN(20) == 0 {
			if _, err := r.b.call(sharesScript, "bye"); err != nil {
				t.Fatal(err)
			}
			held[j] = 0
			check(fmt.Sprintf("step %d, bye of %d", i, j))
			continue
		}
		need := rng.IntN(4)
		bands := "-"
		if need > 0 {
			bands = fmt.Sprintf("%d:%d", rng.IntN(3), need)
		}
		rep := r.syncBands(min(held[j], need), need, bands)
		held[j] = int(rep.held)
		check(fmt.Sprintf("step %d, sync of %d", i, j))
	}
	// A sync renews the expiry of the keys that lived on: ten of its leases.
	rs[0].b.base[1] = int64(100)
	if err := rdb.PExpire(ctx, rs[0].b.keys[skSE], time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	rs[0].sync(0, 1)
	if ttl := rdb.PTTL(ctx, rs[0].b.keys[skSE]).Val(); ttl > time.Second+100*time.Millisecond || ttl < 0 {
		t.Fatalf("the leases' key expires in %v, want its expiry renewed to ten leases (1s)", ttl)
	}
}

// keyWithoutExpiry returns a key of r's Name that has no expiry, or "".
func keyWithoutExpiry(t *testing.T, rdb *redis.Client, r *rawShares) string {
	t.Helper()
	ctx := context.Background()
	keys, err := rdb.Keys(ctx, strings.TrimSuffix(r.b.keys[skS], "s")+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if rdb.PTTL(ctx, k).Val() < 0 {
			return k
		}
	}
	return ""
}

// While a band takes turns, a holder whose demand spans a higher band and
// that one is asked to give back what it holds beyond its share, and a
// holder of a turn in that band is not: the holders' scores tell them
// apart without reading their records.
func TestWhileABandTakesTurnsAHolderOfSeveralBandsIsAsked(t *testing.T) {
	rdb, rs := rawFleet(t, 4, 2)
	a, b, c, d := rs[0], rs[1], rs[2], rs[3]
	asked := func(r *rawShares) bool {
		t.Helper()
		err := rdb.ZScore(context.Background(), r.b.keys[skSV], r.b.replica).Err()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return err == nil
	}
	if rep := a.syncBands(0, 2, "5:1,0:1"); rep.held != 2 {
		t.Fatalf("A got %d slots, want 2", rep.held)
	}
	// B waits with a request of cost 2 in band 0, where one slot is left
	// after band 5: fewer slots than its least share, so band 0 takes
	// turns, and A holds one slot beyond its share.
	if _, err := b.syncRaw(rawArgs{need: 2, bands: "0:2", queued: 2, least: 2}); err != nil {
		t.Fatal(err)
	}
	if !asked(a) {
		t.Fatal("A holds 2 slots for a share of 1 while band 0 takes turns, and was not asked to give one back")
	}
	if _, err := b.b.call(sharesScript, "bye"); err != nil {
		t.Fatal(err)
	}
	if _, err := a.b.call(sharesScript, "bye"); err != nil {
		t.Fatal(err)
	}
	// B, C and D, of cost 1, take turns on the two slots (three least
	// shares): once each has synced in turns, no holder of a turn is asked
	// back by the others' syncs.
	held := map[*rawShares]int{}
	for range 2 {
		for _, r := range []*rawShares{b, c, d} {
			held[r] = int(r.sync(held[r], 2).held)
		}
	}
	var holder *rawShares
	for _, r := range []*rawShares{b, c, d} {
		if held[r] > 0 {
			holder = r
		}
	}
	if holder == nil {
		t.Fatal("no replica of band 0 holds a turn")
	}
	for _, r := range []*rawShares{b, c, d} {
		if r != holder {
			held[r] = int(r.sync(held[r], 2).held)
		}
	}
	if asked(holder) {
		t.Fatalf("a turn of %d slots was asked to give back: turns go back once used", held[holder])
	}
}

// A request that came just before a sync, and does not wait in the
// in-memory Backend yet, is reported in its own band. A replica that never
// had a waiter used to report it in the band below every band, and Redis
// put it behind every other replica in the turns: under a fleet of 1,024
// replicas on 512 slots it waited past its 2 s QueueTimeout.
func TestARequestThatJustCameIsReportedInItsBand(t *testing.T) {
	s := startedShares(t, 0)
	s.noteArrival(backend.Arrival{Cost: 1, Priority: 0})
	if d := s.demand(false); d.need != 1 || d.bands != "0:1" {
		t.Errorf("a request of priority 0 that came: demand %d by band %q, want 1 by band %q", d.need, d.bands, "0:1")
	}
	s.noteArrival(backend.Arrival{Cost: 1, Priority: -3})
	s.noteArrival(backend.Arrival{Cost: 1, Priority: 5})
	// Neither waits yet: the peak is one request, in the higher band.
	if d := s.demand(false); d.bands != "5:1" {
		t.Errorf("requests of priorities -3 and 5 that came: demand by band %q, want %q", d.bands, "5:1")
	}
}

// A reply that leaves a replica short of its target, out of turns, has it
// ask again after a claim window; one that meets its demand, or puts it
// in the turns, does not. Short replicas of a large fleet used to wait for
// their renewal, seconds away, once the holders they asked gave their
// slots to replicas ahead of them: under 1,024 replicas on 512 slots,
// some waited past their 2 s QueueTimeout.
func TestAReplicaShortOfItsTargetAsksAgain(t *testing.T) {
	s := startedShares(t, 0)
	for _, c := range []struct {
		name      string
		rep       shareReply
		need      int
		wantAgain bool
	}{
		{"short of its target", shareReply{held: 0, target: 1, limit: 512}, 2, true},
		{"at its target", shareReply{held: 1, target: 1, limit: 512}, 2, false},
		{"waiting for a turn", shareReply{held: 0, target: 0, limit: 512}, 2, false},
		{"with no demand", shareReply{held: 0, target: 1, limit: 512}, 0, false},
	} {
		s.mu.Lock()
		s.setShareLocked(int(c.rep.held), c.rep, time.Now())
		s.noteReplyLocked(c.rep, c.need, false)
		again := s.againAt
		s.mu.Unlock()
		if got := !again.IsZero(); got != c.wantAgain {
			t.Errorf("%s: asks again %v, want %v", c.name, got, c.wantAgain)
			continue
		}
		if c.wantAgain {
			if d := time.Until(again); d <= 0 || d > s.claimWindow()*6/5 {
				t.Errorf("%s: asks again in %v, want within a claim window (%v)", c.name, d, s.claimWindow())
			}
		}
	}
}

// bandSlots is the slots a report of bands gives band.
func bandSlots(t *testing.T, report string, band int) int {
	t.Helper()
	if report == "-" {
		return 0
	}
	for part := range strings.SplitSeq(report, ",") {
		k, v, _ := strings.Cut(part, ":")
		if k == strconv.Itoa(band) {
			n, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	return 0
}

// Eight requests of priority 0 and one of priority 5 ran here since the
// last report and are gone: the peak they leave is reported as they came,
// not all in the band of the one of priority 5, above priority-3 requests
// elsewhere in the fleet.
func TestAPeakIsReportedAsItsRequestsCame(t *testing.T) {
	s := startedShares(t, 8)
	ctx := context.Background()
	var ts []backend.Ticket
	for range 8 {
		tk, err := s.acquire(ctx, backend.Arrival{Cost: 1, Priority: 0})
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, tk)
	}
	for _, tk := range ts {
		s.release(tk)
	}
	tk, err := s.acquire(ctx, backend.Arrival{Cost: 1, Priority: 5})
	if err != nil {
		t.Fatal(err)
	}
	s.release(tk)
	d := s.demand(false)
	if n := bandSlots(t, d.bands, 5); n > 1 {
		t.Errorf("8 requests of priority 0 and 1 of priority 5 came: demand %d by band %q, %d slots in band 5, want at most 1",
			d.need, d.bands, n)
	}
}

// A sync cannot take an arriving request's band without its peak, or its
// peak without its band: it waits for the arrival to note both. A sync
// between the two used to report the peak below every band.
func TestASyncTakesAnArrivalsBandAndPeakTogether(t *testing.T) {
	s := startedShares(t, 0)
	got := make(chan demandNow, 1)
	s.bands.arrived(5, 1, func() {
		go func() { got <- s.demand(false) }() // a sync, on the coordinator
		select {
		case d := <-got:
			t.Errorf("a sync ran in the middle of an arrival: demand %d by band %q", d.need, d.bands)
		case <-time.After(50 * time.Millisecond):
		}
		s.notePeak(1)
	})
	select {
	case d := <-got:
		if d.need != 1 || d.bands != "5:1" {
			t.Errorf("a request of priority 5 that came: demand %d by band %q, want 1 by band %q", d.need, d.bands, "5:1")
		}
	case <-time.After(time.Second):
		t.Fatal("the sync never ran")
	}
}

// A request of priority 9 that came while one of priority 0 runs here, and
// does not wait yet, is reported in band 9, not in band 0 with what runs.
func TestARequestThatCameBesideARunningOneIsReportedInItsBand(t *testing.T) {
	s := startedShares(t, 1)
	tk, err := s.acquire(context.Background(), backend.Arrival{Cost: 1, Priority: 0})
	if err != nil {
		t.Fatal(err)
	}
	defer s.release(tk)
	_ = s.demand(false)                                  // the grant's report
	s.noteArrival(backend.Arrival{Cost: 1, Priority: 9}) // comes, not queued yet
	if d := s.demand(false); bandSlots(t, d.bands, 9) == 0 {
		t.Errorf("a request of priority 9 that came beside one of priority 0 running: demand %d by band %q, want a slot in band 9",
			d.need, d.bands)
	}
}

// A probe waits a CallTimeout for its answer at first, then twice as long
// after each probe that found Redis still down, and a second from the
// fourth on, whatever the CallTimeout; never past the end of the lease of
// a share it holds. A thousand replicas started at once got their answers
// after the CallTimeout, gave every probe up and sent it again, and stayed
// marked down for tens of seconds. With a CallTimeout below 62.5 ms the
// waits used to stop short of a second, and a replica that started while
// Redis was down never answered 503 (see run).
func TestProbesGrowPatient(t *testing.T) {
	for _, c := range []struct {
		callTimeout time.Duration
		want        []time.Duration
	}{
		{150 * time.Millisecond, []time.Duration{150, 300, 600, 1000, 1000, 1000}},
		{20 * time.Millisecond, []time.Duration{20, 40, 80, 1000, 1000}},
		{time.Millisecond, []time.Duration{1, 2, 4, 1000}},
	} {
		for missed, want := range c.want {
			for _, replicas := range []int64{0, probesAtOnce, 1024} {
				p := pacer{opts: settings{SharePeriod: 50 * time.Millisecond, CallTimeout: c.callTimeout}, missed: missed, replicas: replicas}
				if d := p.patience(); d != want*time.Millisecond {
					t.Fatalf("CallTimeout %v, %d replicas, after %d probes that found Redis down: a probe waits %v, want %v",
						c.callTimeout, replicas, missed, d, want*time.Millisecond)
				}
			}
		}
	}
	// A small fleet waits a CallTimeout: a probe that a partition
	// swallowed held the coordinator up to a second after Redis answered.
	small := pacer{opts: settings{CallTimeout: 150 * time.Millisecond}, missed: 4, replicas: probesAtOnce - 1}
	if d := small.patience(); d != 150*time.Millisecond {
		t.Fatalf("a replica of a fleet of %d waits %v for a probe's answer, want a CallTimeout", probesAtOnce-1, d)
	}
	long := pacer{opts: settings{CallTimeout: 3 * time.Second}, missed: 4}
	if d := long.patience(); d != 3*time.Second {
		t.Fatalf("with a CallTimeout of 3s a probe waits %v, want 3s", d)
	}
	s := startedShares(t, 2)
	now := time.Now()
	s.mu.Lock()
	s.local, s.leaseEnd = 2, now.Add(200*time.Millisecond)
	s.mu.Unlock()
	if d := s.probeWait(now, time.Second); d != 200*time.Millisecond {
		t.Fatalf("a probe with a share whose lease ends in 200ms waits %v, want 200ms", d)
	}
	s.mu.Lock()
	s.local = 0
	s.mu.Unlock()
	if d := s.probeWait(now, time.Second); d != time.Second {
		t.Fatalf("a probe without a share waits %v, want 1s", d)
	}
}

// A probe that got no answer shows Redis down in a small fleet whatever
// it waited, and in a large one (or one not known yet) only if it waited
// the longest: after a thousand replicas started at once, replicas that
// had had an answer answered 503 from their first probe that missed while
// Redis was still busy.
func TestOnlyTheLongestProbeShowsALargeFleetRedisDown(t *testing.T) {
	o := settings{CallTimeout: 150 * time.Millisecond}
	for _, c := range []struct {
		replicas int64
		wait     time.Duration
		want     bool
	}{
		{4, 150 * time.Millisecond, true},
		{probesAtOnce - 1, 150 * time.Millisecond, true},
		{probesAtOnce, 150 * time.Millisecond, false},
		{1024, 600 * time.Millisecond, false},
		{1024, time.Second, true},
		{0, 300 * time.Millisecond, false},
		{0, time.Second, true},
	} {
		p := pacer{opts: o, replicas: c.replicas}
		if got := p.gaveUp(c.wait); got != c.want {
			t.Errorf("%d replicas, a probe that waited %v: gave up %v, want %v", c.replicas, c.wait, got, c.want)
		}
	}
}

// Under FailOpen a lease that ran out stops the replica only once Redis
// looks unreachable: the last call failed and none got an answer for 9/10
// of a lease, or Redis is marked down. A lease can run out while a call
// waits for its CallTimeout (a process frozen, then thawed): the
// coordinator stops admitting when that call fails, not when
// FailureThreshold calls have. A replica whose answers are only late to
// be read, on a busy process, is not stopped, even when one of its calls
// timed out meanwhile.
func TestALeaseRunOutStopsFailOpenOnceACallFailed(t *testing.T) {
	for _, tt := range []struct {
		name     string
		fails    int32
		answered time.Duration // how long ago a call last got an answer
		down     bool
		want     bool // the replica stops
	}{
		{name: "the last call answered"},
		{name: "the last call failed", fails: 1, answered: time.Minute, want: true},
		{name: "the last call failed, others answered lately", fails: 1, answered: DefaultLeaseTTL * 8 / 10},
		{name: "the last call failed, the last answer 19/20 of a lease ago", fails: 1, answered: DefaultLeaseTTL * 19 / 20, want: true},
		{name: "marked down", fails: 3, answered: time.Minute, down: true, want: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for _, timer := range []bool{true, false} {
				s := startedShares(t, 2)
				s.mu.Lock()
				s.local, s.leaseEnd = 2, time.Now().Add(-time.Millisecond)
				s.mu.Unlock()
				s.b.fails.Store(tt.fails)
				s.b.lastOK.Store(time.Now().Add(-tt.answered).UnixNano())
				s.b.down.Store(tt.down)
				if timer {
					s.leaseRanOut()
				} else {
					s.haltIfDown(&pacer{opts: s.b.opts})
				}
				if got := s.isLost(); got != tt.want {
					t.Errorf("timer %v: stopped %v, want %v", timer, got, tt.want)
				}
			}
		})
	}
}

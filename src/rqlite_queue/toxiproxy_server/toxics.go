package main

// Toxics that toxiproxy v2.5.0 lacks. latency_us: its latency toxic counts whole milliseconds,
// too coarse for links of 1 ms with 10 % jitter. tally and cut: they count, so that a test can
// compare what a client saw with what the proxy really held back or cut.

import (
	"bytes"
	"encoding/json"
	"math/rand"
	"sync/atomic"
	"time"

	"github.com/Shopify/toxiproxy/v2/stream"
	"github.com/Shopify/toxiproxy/v2/toxics"
)

// LatencyUs delays every chunk by latency +/- jitter microseconds after it was read, in order
// (a chunk is never passed before the one read ahead of it).
type LatencyUs struct {
	Latency int64 `json:"latency"`
	Jitter  int64 `json:"jitter"`
}

func (t *LatencyUs) GetBufferSize() int { return 1024 }

func (t *LatencyUs) delay() time.Duration {
	delay := t.Latency
	if t.Jitter > 0 {
		//#nosec
		delay += rand.Int63n(t.Jitter*2+1) - t.Jitter
	}
	return time.Duration(delay) * time.Microsecond
}

func (t *LatencyUs) Pipe(stub *toxics.ToxicStub) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			sleep := time.Until(c.Timestamp.Add(t.delay()))
			if sleep > 0 {
				select {
				case <-time.After(sleep):
				case <-stub.Interrupt:
					stub.Output <- c // never drop data on the floor
					return
				}
			}
			stub.Output <- c
		}
	}
}

// startsMessage: the chunk begins an HTTP/1.1 request or reply. On a keep-alive connection a
// client sends its next request only after the last reply, so each message starts a chunk.
func startsMessage(data []byte) bool {
	if bytes.HasPrefix(data, []byte("HTTP/1.")) {
		return true
	}
	for _, method := range []string{"GET ", "POST ", "PUT ", "DELETE ", "HEAD "} {
		if bytes.HasPrefix(data, []byte(method)) {
			return true
		}
	}
	return false
}

// Tally passes everything and counts it: chunks, bytes and HTTP messages begun. Put before a
// toxic that drops data, it counts what that toxic was given. Its counters are its
// attributes (they read back in the API's JSON; setting them does nothing).
type Tally struct {
	Chunks   int64 `json:"chunks"`
	Bytes    int64 `json:"bytes"`
	Messages int64 `json:"messages"`
}

func (t *Tally) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]int64{
		"chunks":   atomic.LoadInt64(&t.Chunks),
		"bytes":    atomic.LoadInt64(&t.Bytes),
		"messages": atomic.LoadInt64(&t.Messages),
	})
}

func (t *Tally) Pipe(stub *toxics.ToxicStub) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			atomic.AddInt64(&t.Chunks, 1)
			atomic.AddInt64(&t.Bytes, int64(len(c.Data)))
			if startsMessage(c.Data) {
				atomic.AddInt64(&t.Messages, 1)
			}
			stub.Output <- c
		}
	}
}

// Cut passes `keep` bytes (keep < 0: all but -keep) of the chunk that begins one HTTP message
// in `every` (counted per proxy and direction) and then closes the connection: on the
// downstream, a reply broken off in its middle after the node did the work. Cut counts the
// messages it broke off; `every` set to 0 (an update of the toxic) stops it, so that its count
// can be read before it is removed.
type Cut struct {
	Every int64 `json:"every"`
	Keep  int64 `json:"keep"`
	Seen  int64 `json:"seen"`
	Cuts  int64 `json:"cuts"`
}

func (t *Cut) MarshalJSON() ([]byte, error) {
	return json.Marshal(map[string]int64{
		"every": atomic.LoadInt64(&t.Every),
		"keep":  t.Keep,
		"seen":  atomic.LoadInt64(&t.Seen),
		"cuts":  atomic.LoadInt64(&t.Cuts),
	})
}

func (t *Cut) Pipe(stub *toxics.ToxicStub) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if !startsMessage(c.Data) {
				stub.Output <- c
				continue
			}
			every := atomic.LoadInt64(&t.Every)
			if every < 1 || atomic.AddInt64(&t.Seen, 1)%every != 0 {
				stub.Output <- c
				continue
			}
			keep := t.Keep
			if keep < 0 {
				keep += int64(len(c.Data))
			}
			if keep >= int64(len(c.Data)) {
				keep = int64(len(c.Data)) - 1
			}
			if keep > 0 {
				stub.Output <- &stream.StreamChunk{Data: c.Data[:keep], Timestamp: c.Timestamp}
			}
			atomic.AddInt64(&t.Cuts, 1)
			stub.Close()
			return
		}
	}
}

// Sever drops what a connection carries from the first chunk that contains `marker` on (the
// connection stays open, silent). Toxiproxy sits in front of a node's port and cannot tell its
// callers apart; Raft's messages name their sender (hashicorp/raft's RPC header carries its
// address), so with a node's advertised Raft address as the marker, sever on the others'
// Raft links drops every message that node sends them, on the connections it has open and on
// those it opens later, and lets the others' messages to each other pass.
type Sever struct {
	Marker string `json:"marker"`
}

type severState struct {
	dropping bool
	tail     []byte // the end of the last chunk: a marker may straddle two
}

func (t *Sever) NewState() interface{} { return new(severState) }

func (t *Sever) Pipe(stub *toxics.ToxicStub) {
	state := stub.State.(*severState)
	marker := []byte(t.Marker)
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil {
				stub.Close()
				return
			}
			if !state.dropping && len(marker) > 0 {
				seen := append(append([]byte{}, state.tail...), c.Data...)
				state.dropping = bytes.Contains(seen, marker)
				if keep := len(marker) - 1; len(seen) > keep {
					state.tail = seen[len(seen)-keep:]
				} else {
					state.tail = seen
				}
			}
			if !state.dropping {
				stub.Output <- c
			}
		}
	}
}

func init() {
	toxics.Register("sever", new(Sever))
	toxics.Register("latency_us", new(LatencyUs))
	toxics.Register("tally", new(Tally))
	toxics.Register("cut", new(Cut))
}

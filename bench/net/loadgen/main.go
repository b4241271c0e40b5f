// Load generator for the network benchmarks (bench/net/run.sh, idle.sh).
//
// echo mode: C clients connect, wait for each other, then each makes R
// round trips of a SIZE-byte message (write it, read SIZE bytes back),
// all clients at once. Prints one line:
//
//	rtps=<round trips/s> p50_us=<latency> p99_us=<latency> clients=C rounds=R
//
// idle mode: opens N connections, prints "open N" once they are all
// established, holds them until SIGTERM/SIGINT or -hold seconds pass,
// then closes them and exits.
//
// Standard library only. The driver pins it to one CPU with taskset, so
// the Go runtime sees one CPU and uses GOMAXPROCS=1.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"
)

func main() {
	mode := flag.String("mode", "echo", "echo or idle")
	addr := flag.String("addr", "127.0.0.1:9000", "server address")
	clients := flag.Int("c", 100, "concurrent clients (echo) or connections (idle)")
	rounds := flag.Int("n", 100, "round trips per client (echo)")
	size := flag.Int("size", 64, "message size in bytes (echo)")
	hold := flag.Float64("hold", 60, "seconds to hold idle connections at most")
	echoFirst := flag.Bool("echo-first", false, "idle: each connection makes one round trip of -size bytes before it holds")
	timeout := flag.Float64("timeout", 60, "seconds before the whole run gives up")
	flag.Parse()
	// A server that stops answering must not hang the driver.
	time.AfterFunc(time.Duration(*timeout*float64(time.Second)), func() {
		fmt.Fprintln(os.Stderr, "loadgen: timed out")
		os.Exit(3)
	})
	switch *mode {
	case "echo":
		echo(*addr, *clients, *rounds, *size)
	case "idle":
		idle(*addr, *clients, *hold, *echoFirst, *size)
	default:
		fmt.Fprintln(os.Stderr, "loadgen: unknown mode", *mode)
		os.Exit(2)
	}
}

func fail(format string, a ...interface{}) {
	fmt.Fprintf(os.Stderr, "loadgen: "+format+"\n", a...)
	os.Exit(1)
}

func dial(addr string) net.Conn {
	var err error
	for try := 0; try < 50; try++ {
		var c net.Conn
		c, err = net.Dial("tcp", addr)
		if err == nil {
			c.(*net.TCPConn).SetNoDelay(true)
			return c
		}
		// A full accept backlog refuses or times out a burst of connects;
		// try again after a pause, as a real client would.
		time.Sleep(10 * time.Millisecond)
	}
	fail("connect %s: %v", addr, err)
	return nil
}

func echo(addr string, clients, rounds, size int) {
	conns := make([]net.Conn, clients)
	for i := range conns {
		conns[i] = dial(addr)
	}
	msg := bytes.Repeat([]byte{'x'}, size)
	lat := make([][]time.Duration, clients)
	var start, done sync.WaitGroup
	start.Add(1)
	done.Add(clients)
	for i := 0; i < clients; i++ {
		go func(i int) {
			defer done.Done()
			c := conns[i]
			buf := make([]byte, size)
			l := make([]time.Duration, 0, rounds)
			start.Wait()
			for r := 0; r < rounds; r++ {
				t := time.Now()
				if _, err := c.Write(msg); err != nil {
					fail("write: %v", err)
				}
				if _, err := io.ReadFull(c, buf); err != nil {
					fail("read: %v", err)
				}
				l = append(l, time.Since(t))
			}
			if !bytes.Equal(buf, msg) {
				fail("echo returned different bytes")
			}
			lat[i] = l
		}(i)
	}
	t0 := time.Now()
	start.Done()
	done.Wait()
	elapsed := time.Since(t0)
	for _, c := range conns {
		c.Close()
	}
	all := make([]time.Duration, 0, clients*rounds)
	for _, l := range lat {
		all = append(all, l...)
	}
	sort.Slice(all, func(a, b int) bool { return all[a] < all[b] })
	pct := func(p float64) float64 {
		return float64(all[int(p*float64(len(all)-1))]) / 1e3
	}
	fmt.Printf("rtps=%.0f p50_us=%.1f p99_us=%.1f clients=%d rounds=%d\n",
		float64(len(all))/elapsed.Seconds(), pct(0.50), pct(0.99),
		clients, rounds)
}

func idle(addr string, n int, hold float64, echoFirst bool, size int) {
	conns := make([]net.Conn, 0, n)
	msg := bytes.Repeat([]byte{'x'}, size)
	buf := make([]byte, size)
	for i := 0; i < n; i++ {
		c := dial(addr)
		// An echo server's connection that has carried traffic, then
		// waits for more: what a server keeps for an idle keep-alive
		// connection.
		if echoFirst {
			if _, err := c.Write(msg); err != nil {
				fail("write: %v", err)
			}
			if _, err := io.ReadFull(c, buf); err != nil {
				fail("read: %v", err)
			}
		}
		conns = append(conns, c)
	}
	// Established in the kernel; the server may still be accepting: the
	// driver waits until the server holds them (its descriptor count).
	fmt.Printf("open %d\n", len(conns))
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	select {
	case <-sig:
	case <-time.After(time.Duration(hold * float64(time.Second))):
	}
	for _, c := range conns {
		c.Close()
	}
}

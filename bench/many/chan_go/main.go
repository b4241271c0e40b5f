// Go's channels between goroutines: the peer of bench/many/chan.lua's
// shapes (pingpong, pingpong64, stream), run with GOMAXPROCS from the
// environment. Prints "SHAPE MESSAGES seconds result" per shape.
//
//	go run . SHAPE [N]
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

func echo(a <-chan int64, b chan<- int64, n int64) {
	for i := int64(0); i < n; i++ {
		b <- <-a
	}
}

func pingpong(n, capacity int64) (int64, float64, int64) {
	a, b := make(chan int64, capacity), make(chan int64, capacity)
	go echo(a, b, n)
	start := time.Now()
	var sum int64
	if capacity == 0 {
		for i := int64(1); i <= n; i++ {
			a <- i
			sum += <-b
		}
	} else {
		for i := int64(0); i < n; {
			k := capacity
			if n-i < k {
				k = n - i
			}
			for j := int64(1); j <= k; j++ {
				a <- i + j
			}
			for j := int64(0); j < k; j++ {
				sum += <-b
			}
			i += k
		}
	}
	return 2 * n, time.Since(start).Seconds(), sum
}

func stream(n int64) (int64, float64, int64) {
	ch := make(chan int64, 64)
	start := time.Now()
	go func() {
		for i := int64(1); i <= n; i++ {
			ch <- i
		}
	}()
	var sum int64
	for i := int64(0); i < n; i++ {
		sum += <-ch
	}
	return n, time.Since(start).Seconds(), sum
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: chan_go SHAPE [N]")
		os.Exit(2)
	}
	shape := os.Args[1]
	n := int64(100000)
	if shape == "stream" {
		n = 1000000
	}
	if len(os.Args) > 2 {
		v, err := strconv.ParseInt(os.Args[2], 10, 64)
		if err != nil || v < 1 {
			fmt.Fprintf(os.Stderr, "chan_go: N must be a positive whole number, got %q\n", os.Args[2])
			os.Exit(2)
		}
		n = v
	}
	var msgs, sum int64
	var dt float64
	switch shape {
	case "pingpong":
		msgs, dt, sum = pingpong(n, 0)
	case "pingpong64":
		msgs, dt, sum = pingpong(n, 64)
	case "stream":
		msgs, dt, sum = stream(n)
	default:
		fmt.Fprintf(os.Stderr, "chan_go: unknown shape %q\n", shape)
		os.Exit(2)
	}
	if sum != n*(n+1)/2 {
		fmt.Fprintf(os.Stderr, "chan_go: wrong sum %d\n", sum)
		os.Exit(1)
	}
	fmt.Printf("%s %d %.6f %d\n", shape, msgs, dt, sum)
}

// skynet with goroutines and channels: the Go peer of bench/many/many.lua
// skynet_chan. Each goroutine of the 10-ary tree sends the sum of its
// subtree on its parent's channel. Prints "skynet_go N seconds result".
//
//	go run . [N]   (GOMAXPROCS from the environment)
package main

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

func skynet(out chan<- int64, num, size, div int64) {
	if size == 1 {
		out <- num
		return
	}
	sub := size / div
	kids := make(chan int64, div)
	for i := int64(0); i < div; i++ {
		go skynet(kids, num+i*sub, sub, div)
	}
	var sum int64
	for i := int64(0); i < div; i++ {
		sum += <-kids
	}
	out <- sum
}

func main() {
	n := int64(1000000)
	if len(os.Args) > 1 {
		v, err := strconv.ParseInt(os.Args[1], 10, 64)
		if err != nil || v < 1 {
			fmt.Fprintf(os.Stderr, "skynet: N must be a positive whole number, got %q\n", os.Args[1])
			os.Exit(2)
		}
		n = v
	}
	start := time.Now()
	out := make(chan int64, 1)
	go skynet(out, 0, n, 10)
	result := <-out
	dt := time.Since(start).Seconds()
	if result != n*(n-1)/2 {
		fmt.Fprintf(os.Stderr, "skynet: wrong result %d\n", result)
		os.Exit(1)
	}
	fmt.Printf("skynet_go %d %.3f %d\n", n, dt, result)
}

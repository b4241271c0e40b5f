// The Go peers of the network benchmarks: an echo server on the net
// package (a goroutine per connection) and an HTTP "hello" server on
// net/http, keep-alive. GOMAXPROCS comes from the environment.
//
//	goserver -mode echo|http -addr 127.0.0.1:PORT
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
)

func main() {
	mode := flag.String("mode", "echo", "echo or http")
	addr := flag.String("addr", "127.0.0.1:9000", "listen address")
	flag.Parse()
	switch *mode {
	case "echo":
		ln, err := net.Listen("tcp", *addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "goserver:", err)
			os.Exit(1)
		}
		for {
			c, err := ln.Accept()
			if err != nil {
				continue
			}
			go func(c net.Conn) {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Read(buf)
					if err != nil {
						return
					}
					if _, err := c.Write(buf[:n]); err != nil {
						return
					}
				}
			}(c)
		}
	case "http":
		body := []byte("Hello, World!\n")
		http.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.Write(body)
		})
		if err := http.ListenAndServe(*addr, nil); err != nil {
			fmt.Fprintln(os.Stderr, "goserver:", err)
			os.Exit(1)
		}
	default:
		fmt.Fprintln(os.Stderr, "goserver: unknown mode", *mode)
		os.Exit(2)
	}
}

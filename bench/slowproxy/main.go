// Command slowproxy is a TCP proxy that delays every byte a server sends
// back by a fixed time, in order: a store or broker with a longer round
// trip, for the features phase (docs/benchmarks.md, feat35):
//
//	go run ./slowproxy -listen 127.0.0.1:7397 -target 127.0.0.1:7396 -delay 3ms
package main

import (
	"flag"
	"io"
	"log"
	"net"
	"time"
)

type chunk struct {
	at   time.Time
	data []byte
}

func main() {
	listen := flag.String("listen", "127.0.0.1:7397", "address to listen on")
	target := flag.String("target", "127.0.0.1:7396", "address of the server")
	delay := flag.Duration("delay", 2*time.Millisecond, "how long each answer is held back")
	flag.Parse()
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			log.Fatal(err)
		}
		go func() {
			s, err := net.Dial("tcp", *target)
			if err != nil {
				c.Close()
				return
			}
			go func() { _, _ = io.Copy(s, c); s.Close() }()
			ch := make(chan chunk, 1024)
			go func() {
				for k := range ch {
					time.Sleep(time.Until(k.at.Add(*delay)))
					if _, err := c.Write(k.data); err != nil {
						return
					}
				}
				c.Close()
			}()
			buf := make([]byte, 64<<10)
			for {
				n, err := s.Read(buf)
				if n > 0 {
					ch <- chunk{time.Now(), append([]byte(nil), buf[:n]...)}
				}
				if err != nil {
					close(ch)
					return
				}
			}
		}()
	}
}

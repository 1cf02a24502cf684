package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"time"

	gonats "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	goredis "github.com/redis/go-redis/v9"
)

// machine describes where the run happened.
type machine struct {
	CPUs      int
	CPUModel  string
	MemoryGiB float64
	Kernel    string
	Go        string
	Servers   map[string]string // broker → version
	Modules   map[string]string // module path → version
}

// describeMachine collects the machine's facts and the versions in play.
func describeMachine(srv servers) machine {
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Servers: map[string]string{}, Modules: map[string]string{}}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				m.CPUModel = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		fmt.Sscanf(strings.SplitN(string(b), "\n", 2)[0], "MemTotal: %f kB", &kb)
		m.MemoryGiB = kb / (1 << 20)
	}
	if out, err := exec.Command("uname", "-r").Output(); err == nil {
		m.Kernel = strings.TrimSpace(string(out))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Redis})
	if info, err := rdb.Info(ctx, "server").Result(); err == nil {
		for line := range strings.Lines(info) {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
				m.Servers["Redis"] = v
			}
		}
	}
	rdb.Close()
	if conn, err := amqp.Dial(srv.AMQP); err == nil {
		m.Servers["RabbitMQ"] = fmt.Sprint(conn.Properties["version"])
		conn.Close()
	}
	if nc, err := gonats.Connect(srv.NATS); err == nil {
		m.Servers["NATS"] = nc.ConnectedServerVersion()
		nc.Close()
	}
	if b, err := os.ReadFile("../.tools/azurite/node_modules/azurite/package.json"); err == nil {
		var pkg struct{ Version string }
		if json.Unmarshal(b, &pkg) == nil {
			m.Servers["Azurite"] = pkg.Version
		}
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			for _, want := range []string{"hibiken/asynq", "ThreeDotsLabs/watermill", "RichardKnop/machinery", "redis/go-redis", "rabbitmq/amqp091-go", "nats-io/nats.go", "storage/azqueue", "gonum.org/v1/plot"} {
				if strings.Contains(d.Path, want) {
					m.Modules[d.Path] = d.Version
				}
			}
		}
	}
	return m
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// dialOK reports whether addr accepts a TCP connection.
func dialOK(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return false
	}
	c.Close()
	return true
}

// leftovers lists what this tool may have left on the brokers: Redis keys
// and JetStream streams named bench….
func leftovers(srv servers) []string {
	var out []string
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.Redis})
	for _, pat := range []string{"bench*", "{bench:*", "asynq:{bench-*"} {
		keys, _ := rdb.Keys(ctx, pat).Result()
		out = append(out, keys...)
	}
	rdb.Close()
	if nc, err := gonats.Connect(srv.NATS); err == nil {
		if js, err := jetstream.New(nc); err == nil {
			names := js.StreamNames(ctx)
			for n := range names.Name() {
				if strings.HasPrefix(n, "bench") {
					out = append(out, "stream "+n)
				}
			}
		}
		nc.Close()
	}
	return out
}

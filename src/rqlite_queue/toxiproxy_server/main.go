// Toxiproxy v2.5.0's server with three more toxics for rqlite-queue's tests and benchmarks
// (toxics.go). It is toxiproxy's own cmd/server, less its flags for metrics and a config file;
// `rqlite-queue toxiproxy` builds it (src/rqlite_queue/toxiproxy.py).
package main

import (
	"flag"
	"fmt"
	"math/rand"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// Build is the version of the toxics added here: the finder refuses a binary that prints
// another (toxics.go changed since it was built).
const Build = "rqlite-queue.1"

func main() {
	host := flag.String("host", "127.0.0.1", "Host for toxiproxy's API to listen on")
	port := flag.String("port", "8474", "Port for toxiproxy's API to listen on")
	seed := flag.Int64("seed", time.Now().UnixNano(), "Seed for randomizing toxics with")
	version := flag.Bool("version", false, "print the version")
	flag.Parse()
	if *version {
		fmt.Printf("toxiproxy-server version %s+%s\n", toxiproxy.Version, Build)
		return
	}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		os.Exit(0)
	}()
	rand.Seed(*seed)
	level := zerolog.WarnLevel
	if value, ok := os.LookupEnv("LOG_LEVEL"); ok {
		if parsed, err := zerolog.ParseLevel(value); err == nil {
			level = parsed
		}
	}
	logger := zerolog.New(os.Stdout).With().Timestamp().Logger().Level(level)
	metrics := toxiproxy.NewMetricsContainer(prometheus.NewRegistry())
	toxiproxy.NewServer(metrics, logger).Listen(*host, *port)
}

// Command openim-deps runs, in one process, the two backing services of
// OpenIM that Debian does not package: a Kafka broker (franz-go's kfake,
// in memory) and a MongoDB wire-protocol server (FerretDB v1, embedded,
// on PostgreSQL, behind mongofix, which rewrites the commands of OpenIM's
// that FerretDB v1 cannot run). It exists only so that .ci/openim.sh can
// run a real OpenIM v3.8.3 on a machine without Kafka or MongoDB; it is a
// separate module so that imcanary's own go.mod never gains either as a
// dependency.
//
// FerretDB is on PostgreSQL, not SQLite: its SQLite backend finds a
// document by nothing but _id without decoding every document of the
// collection in Go, and a lookup by _id scans too (its index is on
// another expression than its queries use: EXPLAIN QUERY PLAN said SCAN).
// On SQLite, the real OpenIM's pushes fell seconds behind within a minute
// of 12 messages a second; on PostgreSQL, whose queries run in the
// database, the same tests push every message on time.
//
// Both listen on loopback only. It stops on SIGTERM or SIGINT: FerretDB
// closes its listener and its connections, then the broker closes.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/FerretDB/FerretDB/ferretdb"
	"github.com/twmb/franz-go/pkg/kfake"

	"imcanary.invalid/mongofix"
)

// The topics OpenIM's kafka.yml names. They are created before any
// client connects: msgtransfer and push join their consumer groups at
// start, before anything has been produced that would auto-create them.
var topics = []string{"toRedis", "toMongo", "toPush", "toOfflinePush"}

func main() {
	kafkaPort := flag.Int("kafka-port", 0, "port of the Kafka broker on 127.0.0.1")
	mongoPort := flag.Int("mongo-port", 0, "port of the MongoDB-protocol server on 127.0.0.1")
	socket := flag.String("ferretdb-socket", "", "Unix socket FerretDB listens on, behind the MongoDB port")
	partitions := flag.Int("partitions", 8, "partitions of each seeded topic")
	debug := flag.String("debug-socket", "", "serve Go's profiles (net/http/pprof) on this Unix socket: where the time of FerretDB and mongofix goes")
	pgURL := flag.String("postgresql-url", "", "the PostgreSQL FerretDB keeps its data in (a URL); its database must be empty")
	slow := flag.Duration("slow", 200*time.Millisecond, "log MongoDB commands that take this long or longer (0: none)")
	flag.Parse()

	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if *debug != "" {
		if err := serveDebug(ctx, *debug); err != nil {
			logger.Error("openim-deps failed", "err", err)
			os.Exit(1)
		}
	}
	if err := run(ctx, logger, *kafkaPort, *mongoPort, *socket, *pgURL, *partitions, *slow); err != nil {
		logger.Error("openim-deps failed", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, logger *slog.Logger, kafkaPort, mongoPort int, socket, pgURL string, partitions int, slow time.Duration) error {
	if kafkaPort < 1 || kafkaPort > 65535 || mongoPort < 1 || mongoPort > 65535 {
		return fmt.Errorf("-kafka-port %d and -mongo-port %d must both be ports (1-65535)", kafkaPort, mongoPort)
	}
	if pgURL == "" || socket == "" {
		return errors.New("-postgresql-url and -ferretdb-socket are required")
	}
	if partitions < 1 {
		return fmt.Errorf("-partitions %d must be at least 1", partitions)
	}
	// One broker: kfake's default is three on random ports, each of which
	// a client would be told about in the metadata and then dial.
	cluster, err := kfake.NewCluster(
		kfake.Ports(kafkaPort),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(partitions),
		kfake.SeedTopics(int32(partitions), topics...),
	)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	defer cluster.Close()

	// FerretDB listens on a Unix socket, so that the only ports open are
	// those .ci/openim.sh names; OpenIM reaches it only through mongofix.
	mongoAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(mongoPort))
	ln, err := net.Listen("tcp", mongoAddr)
	if err != nil {
		return fmt.Errorf("mongodb: %w", err)
	}
	defer ln.Close()
	fdb, err := ferretdb.New(&ferretdb.Config{
		Listener: ferretdb.ListenerConfig{Unix: socket},
		// FerretDB logs every connection and command at info: warnings
		// and errors are what a failed run needs.
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})).
			With("component", "ferretdb"),
		Handler:       "postgresql",
		PostgreSQLURL: pgURL,
	})
	if err != nil {
		return fmt.Errorf("ferretdb: %w", err)
	}
	proxy := mongofix.New("unix", socket, slow, logger.With("component", "mongofix"))
	logger.Info("listening", "kafka", cluster.ListenAddrs(), "mongodb", mongoAddr, "ferretdb", socket, "topics", topics)

	// Run returns once ctx is done and the listener has stopped serving.
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = fdb.Run(ctx)
	}()
	served := make(chan error, 1)
	go func() { served <- proxy.Serve(ctx, ln) }()
	select {
	case <-ctx.Done():
	case err := <-served:
		if err != nil {
			return err
		}
	}
	logger.Info("stopping", "rewritten", proxy.String())
	logger.Info("mongodb commands", "timings", proxy.TimingsString())
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		return errors.New("ferretdb did not stop within 10s")
	}
	return nil
}

// serveDebug serves the profiles on a Unix socket until ctx is done.
func serveDebug(ctx context.Context, path string) error {
	ln, err := net.Listen("unix", path)
	if err != nil {
		return fmt.Errorf("-debug-socket: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	context.AfterFunc(ctx, func() { srv.Close() })
	go func() { _ = srv.Serve(ln) }()
	return nil
}

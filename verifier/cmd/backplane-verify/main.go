// Command backplane-verify is an independent offline verifier of Agent Backplane audit exports,
// written from the export format alone. It shares no code with the server.
//
//	backplane-verify verify LOCATION --public-key KEY [--public-key OLD_KEY] [--endpoint-url URL] [--approvals]
//	backplane-verify check-proof BUNDLE --public-key KEY
//	backplane-verify verify-events FILE|- [--approvals]
//
// LOCATION is a directory, a file:// URL or s3://bucket/prefix. KEY is 64 hex digits, or a file
// holding them or a PEM Ed25519 public key. Exit status: 0 verified, 1 a problem (the message
// names the segment and line), 2 a usage error or an unreadable location.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/agent-backplane/verifier/audit"
	"github.com/agent-backplane/verifier/jcs"
)

const usage = `usage: backplane-verify verify LOCATION --public-key KEY [--endpoint-url URL] [--approvals]
       backplane-verify check-proof BUNDLE --public-key KEY
       backplane-verify verify-events FILE [--approvals]`

// arguments is a command line read by the rules of the reference verifier's: options may come
// before or after the positional argument, as --name VALUE or --name=VALUE.
type arguments struct {
	positional  []string
	publicKeys  []string
	endpointURL string
	approvals   bool
}

func parseArguments(args []string, allowed ...string) (*arguments, error) {
	parsed := &arguments{}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if !strings.HasPrefix(arg, "--") || arg == "--" {
			parsed.positional = append(parsed.positional, arg)
			continue
		}
		name, value, inline := strings.Cut(arg, "=")
		if !contains(allowed, name) {
			return nil, fmt.Errorf("unrecognized argument: %s", arg)
		}
		if name == "--approvals" {
			if inline {
				return nil, fmt.Errorf("argument --approvals: ignored explicit argument %q", value)
			}
			parsed.approvals = true
			continue
		}
		if !inline {
			if i+1 >= len(args) {
				return nil, fmt.Errorf("argument %s: expected one argument", name)
			}
			i++
			value = args[i]
		}
		switch name {
		case "--public-key":
			parsed.publicKeys = append(parsed.publicKeys, value)
		case "--endpoint-url":
			parsed.endpointURL = value
		}
	}
	if len(parsed.positional) != 1 {
		return nil, fmt.Errorf("expected one location or file, got %d", len(parsed.positional))
	}
	if contains(allowed, "--public-key") && len(parsed.publicKeys) == 0 {
		return nil, fmt.Errorf("the following arguments are required: --public-key")
	}
	return parsed, nil
}

func contains(names []string, name string) bool {
	for _, candidate := range names {
		if candidate == name {
			return true
		}
	}
	return false
}

func trustedKeys(values []string) (map[string]bool, error) {
	trusted := map[string]bool{}
	for _, value := range values {
		key, err := audit.ParsePublicKey(value)
		if err != nil {
			return nil, err
		}
		trusted[key] = true
	}
	return trusted, nil
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, usage)
		return 2
	}
	var (
		parsed *arguments
		err    error
	)
	switch args[0] {
	case "verify":
		parsed, err = parseArguments(args[1:], "--public-key", "--endpoint-url", "--approvals")
	case "check-proof":
		parsed, err = parseArguments(args[1:], "--public-key")
	case "verify-events":
		parsed, err = parseArguments(args[1:], "--approvals")
	default:
		err = fmt.Errorf("unknown command %q", args[0])
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s\nerror: %v\n", usage, err)
		return 2
	}
	switch args[0] {
	case "check-proof":
		return checkProof(parsed, stdout, stderr)
	case "verify-events":
		return verifyEvents(parsed, stdin, stdout, stderr)
	}
	return verify(parsed, stdout, stderr)
}

func verify(parsed *arguments, stdout, stderr io.Writer) int {
	trusted, err := trustedKeys(parsed.publicKeys)
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return 2
	}
	store, err := audit.OpenLocation(parsed.positional[0], parsed.endpointURL)
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return 2
	}
	summary, err := audit.VerifyExport(store, trusted)
	var problem *audit.Problem
	switch {
	case errors.As(err, &problem):
		fmt.Fprintf(stderr, "FAILED %s: %s\n", store.URL(), problem)
		return 1
	case err != nil:
		fmt.Fprintf(stderr, "error: cannot read %s: %v\n", store.URL(), err)
		return 2
	}
	fmt.Fprintln(stdout, summary)
	if parsed.approvals {
		printCalls(stdout, summary.Gated)
	}
	return 0
}

// printCalls lists each gated call on its own line; with none, the list is one empty line.
func printCalls(stdout io.Writer, gated *audit.GatedCalls) {
	lines := make([]string, len(gated.Calls))
	for i, call := range gated.Calls {
		lines[i] = call.String()
	}
	fmt.Fprintln(stdout, strings.Join(lines, "\n"))
}

func checkProof(parsed *arguments, stdout, stderr io.Writer) int {
	trusted, err := trustedKeys(parsed.publicKeys)
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return 2
	}
	file := parsed.positional[0]
	data, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return 2
	}
	bundle, err := jcs.Parse(data)
	if err != nil {
		fmt.Fprintf(stderr, "error: %s is not valid JSON (%v)\n", file, err)
		return 2
	}
	verdict, err := audit.CheckProofBundle(bundle, trusted)
	if err != nil {
		fmt.Fprintf(stderr, "FAILED %s: %v\n", file, err)
		return 1
	}
	fmt.Fprintln(stdout, verdict)
	return 0
}

func verifyEvents(parsed *arguments, stdin io.Reader, stdout, stderr io.Writer) int {
	file, source := parsed.positional[0], parsed.positional[0]
	var (
		data []byte
		err  error
	)
	if file == "-" {
		source = "standard input"
		data, err = io.ReadAll(stdin)
	} else {
		data, err = os.ReadFile(file)
	}
	if err != nil {
		fmt.Fprintf(stderr, "error: %v\n", err)
		return 2
	}
	summary, err := audit.VerifyEventLines(data, source)
	if err != nil {
		fmt.Fprintf(stderr, "FAILED %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, summary)
	if parsed.approvals {
		printCalls(stdout, summary.Gated)
	}
	return 0
}

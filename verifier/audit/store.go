package audit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
)

// Store is where an export lives, read only.
type Store interface {
	// URL names the location in messages: file:///abs/path or s3://bucket/prefix/.
	URL() string
	// Names lists the objects directly in the location, sorted.
	Names() ([]string, error)
	// Read returns an object's bytes; found is false when it does not exist. Any other failure
	// is an error, which the command reports as an unreadable location (exit 2), never as a
	// verdict on the export.
	Read(name string) (data []byte, found bool, err error)
}

// OpenLocation opens a directory path, a file:// URL or s3://bucket/prefix for reading.
func OpenLocation(location, endpointURL string) (Store, error) {
	scheme, rest := splitScheme(location)
	switch scheme {
	case "":
		return newDirectoryStore(location), nil
	case "file":
		return newDirectoryStore(unquote(urlPath(rest))), nil
	case "s3":
		bucket, prefix := splitAuthority(rest)
		if bucket == "" {
			return nil, fmt.Errorf("%s names no bucket (s3://bucket/prefix)", pyStringRepr(location))
		}
		return newS3Store(bucket, unquote(prefix), endpointURL)
	}
	return nil, fmt.Errorf("%s: only a directory, file:// or s3:// is understood", pyStringRepr(location))
}

// splitScheme finds a URL scheme as RFC 3986 spells one (a letter, then letters, digits, + - .,
// before the first colon), lowercased; a plain path has none.
func splitScheme(location string) (string, string) {
	colon := strings.IndexByte(location, ':')
	if colon <= 0 {
		return "", location
	}
	for i, c := range location[:colon] {
		letter := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
		if !letter && (i == 0 || !(c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.')) {
			return "", location
		}
	}
	return strings.ToLower(location[:colon]), location[colon+1:]
}

// urlPath drops the //authority, the ?query and the #fragment of what follows a scheme.
func urlPath(rest string) string {
	_, path := splitAuthority(rest)
	return path
}

func splitAuthority(rest string) (string, string) {
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest = rest[:i]
	}
	if !strings.HasPrefix(rest, "//") {
		return "", rest
	}
	rest = rest[2:]
	if slash := strings.IndexByte(rest, '/'); slash >= 0 {
		return rest[:slash], rest[slash:]
	}
	return rest, ""
}

func unquote(text string) string {
	decoded, err := url.PathUnescape(text)
	if err != nil {
		return text
	}
	return decoded
}

// directoryStore is an export in a local directory.
type directoryStore struct {
	path string
	url  string
}

func newDirectoryStore(path string) *directoryStore {
	return &directoryStore{path: path, url: fileURI(resolve(path))}
}

// resolve makes a path absolute with its symbolic links followed as far as it exists.
func resolve(path string) string {
	absolute, err := filepath.Abs(path)
	if err != nil {
		return path
	}
	missing := ""
	for current := absolute; ; current = filepath.Dir(current) {
		if real, err := filepath.EvalSymlinks(current); err == nil {
			return filepath.Join(real, missing)
		}
		if current == filepath.Dir(current) {
			return absolute
		}
		missing = filepath.Join(filepath.Base(current), missing)
	}
}

// fileURI percent-encodes every byte but the unreserved ones and the slash.
func fileURI(path string) string {
	var out strings.Builder
	out.WriteString("file://")
	for i := 0; i < len(path); i++ {
		c := path[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("/_.-~", c) >= 0 {
			out.WriteByte(c)
		} else {
			fmt.Fprintf(&out, "%%%02X", c)
		}
	}
	return out.String()
}

func (d *directoryStore) URL() string { return d.url }

func (d *directoryStore) Names() ([]string, error) {
	entries, err := os.ReadDir(d.path)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, entry := range entries {
		// A regular file, following a symbolic link; anything unreadable is not one.
		if info, err := os.Stat(filepath.Join(d.path, entry.Name())); err == nil && info.Mode().IsRegular() {
			names = append(names, entry.Name())
		}
	}
	sort.Strings(names)
	return names, nil
}

func (d *directoryStore) Read(name string) ([]byte, bool, error) {
	data, err := os.ReadFile(filepath.Join(d.path, name))
	if errors.Is(err, os.ErrNotExist) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return data, true, nil
}

// s3Store is an export under a prefix of a bucket, read with the default credential chain.
type s3Store struct {
	bucket, prefix string
	client         *s3.Client
}

func newS3Store(bucket, prefix, endpointURL string) (*s3Store, error) {
	if endpointURL == "" {
		endpointURL = os.Getenv("AWS_ENDPOINT_URL")
	}
	cfg, err := config.LoadDefaultConfig(context.Background(), config.WithRetryMaxAttempts(2))
	if err != nil {
		return nil, err
	}
	if cfg.Region == "" {
		cfg.Region = os.Getenv("AWS_DEFAULT_REGION")
	}
	if cfg.Region == "" {
		cfg.Region = "us-east-1"
	}
	client := s3.NewFromConfig(cfg, func(o *s3.Options) {
		if endpointURL != "" {
			o.BaseEndpoint = aws.String(endpointURL)
			// S3-compatible servers on a host name or an IP seldom serve bucket subdomains.
			o.UsePathStyle = true
		}
		// The manifest's SHA-256 is the integrity check that matters; a server's optional
		// checksum headers are not required to be there.
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	trimmed := strings.Trim(prefix, "/")
	if trimmed != "" {
		trimmed += "/"
	}
	return &s3Store{bucket: bucket, prefix: trimmed, client: client}, nil
}

func (s *s3Store) URL() string { return "s3://" + s.bucket + "/" + s.prefix }

func (s *s3Store) context() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 60*time.Second)
}

func (s *s3Store) Names() ([]string, error) {
	ctx, cancel := s.context()
	defer cancel()
	var names []string
	pages := s3.NewListObjectsV2Paginator(s.client, &s3.ListObjectsV2Input{
		Bucket: aws.String(s.bucket), Prefix: aws.String(s.prefix),
	})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, fmt.Errorf("S3 list_objects_v2 on %s: %w", s.URL(), err)
		}
		for _, item := range page.Contents {
			name := strings.TrimPrefix(aws.ToString(item.Key), s.prefix)
			if name != "" && !strings.Contains(name, "/") {
				names = append(names, name)
			}
		}
	}
	sort.Strings(names)
	return names, nil
}

func (s *s3Store) Read(name string) ([]byte, bool, error) {
	ctx, cancel := s.context()
	defer cancel()
	response, err := s.client.GetObject(ctx, &s3.GetObjectInput{
		Bucket: aws.String(s.bucket), Key: aws.String(s.prefix + name),
	})
	var apiError smithy.APIError
	if errors.As(err, &apiError) && (apiError.ErrorCode() == "NoSuchKey" || apiError.ErrorCode() == "404") {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("S3 get_object %s%s: %w", s.URL(), name, err)
	}
	defer response.Body.Close()
	data, err := io.ReadAll(response.Body)
	if err != nil {
		return nil, false, fmt.Errorf("S3 get_object %s%s: %w", s.URL(), name, err)
	}
	return data, true, nil
}

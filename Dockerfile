# Build: docker build -t imcanary .
# The image runs the daemon; mount a configuration and point --config at it.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# A static binary: the runtime image has no libc.
RUN CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/imcanary ./cmd/imcanary

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/imcanary /usr/local/bin/imcanary
# 9464: /metrics, /healthz, /readyz.
EXPOSE 9464
USER nonroot
ENTRYPOINT ["/usr/local/bin/imcanary"]
CMD ["run", "--http.listen=:9464"]

#!/usr/bin/perl
# AnyEvent::RabbitMQ (Net::AMQP, opens with AMQP 0-9's header) against a broker:
# connect, declare, confirm-mode publish, consume, ack. Prints one line per step; exit 0 when all pass.
use strict;
use warnings;
use AnyEvent;
use AnyEvent::RabbitMQ;

my ($host, $port, $queue) = @ARGV;
$| = 1;
my $done = AnyEvent->condvar;
my $timer = AnyEvent->timer(after => 30, cb => sub { $done->croak("timed out") });
my $ar = AnyEvent::RabbitMQ->new->load_xml_spec();
my $fail = sub { my $what = shift; return sub { $done->croak("$what failed: " . join(" ", map { ref $_ ? ref $_ : $_ } @_)) } };

$ar->connect(
    host => $host, port => $port, user => 'guest', pass => 'guest', vhost => '/', timeout => 10,
    on_failure => $fail->('connect'), on_read_failure => $fail->('read'),
    on_close => sub { },
    on_success => sub {
        my $ar = shift;
        print "connected ", $ar->server_properties->{product}, "\n";
        $ar->open_channel(on_failure => $fail->('open_channel'), on_success => sub {
            my $ch = shift;
            $ch->declare_queue(queue => $queue, auto_delete => 0, on_failure => $fail->('declare_queue'),
                on_success => sub {
                    my $frame = shift;
                    print "declared ", $frame->method_frame->queue, "\n";
                    $ch->confirm(on_failure => $fail->('confirm'), on_success => sub {
                        my $acked = 0;
                        for my $i (1 .. 3) {
                            $ch->publish(exchange => '', routing_key => $queue, body => "perl $i",
                                header => { content_type => 'text/plain', headers => { n => $i } },
                                on_ack => sub { $acked++; print "confirmed $acked\n"; },
                                on_nack => $fail->('publish'));
                        }
                        my $got = 0;
                        $ch->consume(queue => $queue, no_ack => 0, on_failure => $fail->('consume'),
                            on_consume => sub {
                                my $msg = shift;
                                $got++;
                                print "got ", $msg->{body}->payload, " ", $msg->{header}->content_type,
                                      " n=", $msg->{header}->headers->{n}, "\n";
                                $ch->ack(delivery_tag => $msg->{deliver}->method_frame->delivery_tag);
                                if ($got == 3) {
                                    $ch->delete_queue(queue => $queue, on_failure => $fail->('delete_queue'),
                                        on_success => sub { print "deleted\n"; $done->send; });
                                }
                            });
                    });
                });
        });
    },
);
eval { $done->recv; 1 } or do { print "error $@\n"; exit 1 };
$ar->close(on_success => sub {}, on_failure => sub {});
print "ok\n";
